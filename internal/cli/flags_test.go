package cli

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/reconnect"
)

// runWith runs a one-command app whose action records its arguments and
// the flags it saw.
func runWith(t *testing.T, args ...string) (got []string, seen map[string]any, err error) {
	t.Helper()
	cmd := &cli.Command{
		Name: "x",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", Value: defaultURL},
			&cli.BoolFlag{Name: "spawn"},
			&cli.DurationFlag{Name: "timeout", Value: time.Minute},
			&cli.StringSliceFlag{Name: "env"},
		},
		Action: flagsAnywhere("x", func(c *cli.Context, a []string) error {
			got = a
			seen = map[string]any{"url": c.String("url"), "url set": c.IsSet("url"), "spawn": c.Bool("spawn"),
				"timeout": c.Duration("timeout"), "env": c.StringSlice("env")}
			return nil
		}),
	}
	app := &cli.App{Name: "boxrt", Commands: []*cli.Command{cmd}, Writer: &bytes.Buffer{}, ErrWriter: &bytes.Buffer{}}
	err = app.Run(append([]string{"boxrt", "x"}, args...))
	return got, seen, err
}

func TestFlagsAnywhere(t *testing.T) {
	got, seen, err := runWith(t, "a", "--url", "ws://h:1", "b", "--spawn", "--timeout=5s", "--env", "A=1", "--env", "B=2")
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, got)
	assert.Equal(t, map[string]any{"url": "ws://h:1", "url set": true, "spawn": true, "timeout": 5 * time.Second, "env": []string{"A=1", "B=2"}}, seen)

	got, seen, err = runWith(t, "--url", "ws://first:1", "a", "--url", "ws://last:1")
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, got)
	assert.Equal(t, "ws://last:1", seen["url"], "a later flag wins")

	got, seen, err = runWith(t, "s1", "--spawn", "--", "ls", "--url", "-la")
	require.NoError(t, err)
	assert.Equal(t, []string{"s1", "--", "ls", "--url", "-la"}, got, "after -- everything is an argument")
	assert.Equal(t, defaultURL, seen["url"])
	assert.Equal(t, false, seen["url set"])

	got, _, err = runWith(t, "s1", "--", "--spawn")
	require.NoError(t, err)
	assert.Equal(t, []string{"s1", "--", "--spawn"}, got)

	_, _, err = runWith(t, "a", "--bogus")
	var ee *exitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.code)
	assert.Contains(t, ee.msg, "x: flag provided but not defined: -bogus (see boxrt x --help)")

	_, _, err = runWith(t, "a", "--timeout", "soon")
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.code)
}

func TestShellLine(t *testing.T) {
	assert.Equal(t, "echo $HOME | wc -c", shellLine([]string{"echo $HOME | wc -c"}))
	assert.Equal(t, `printf %s 'a b' 'it'\''s' '$HOME' /x.y`, shellLine([]string{"printf", "%s", "a b", "it's", "$HOME", "/x.y"}))
}

func TestCommandExit(t *testing.T) {
	code := func(n int) *int { return &n }
	tests := []struct {
		status string
		exit   *int
		want   int
		ended  bool
	}{
		{"completed", code(0), 0, true},
		{"completed", code(7), 7, true},
		{"timed_out", nil, 124, true},
		{"canceled", nil, 125, true},
		{"running", nil, 0, false},
		{"", nil, 0, false},
	}
	for _, tt := range tests {
		got, ended := commandExit(tt.status, tt.exit)
		assert.Equal(t, tt.want, got, tt.status)
		assert.Equal(t, tt.ended, ended, tt.status)
	}
	got, ended := resultExit(json.RawMessage(`{"exec_id":"x","status":"running","exit_code":null}`))
	assert.Equal(t, 0, got)
	assert.False(t, ended, "box_exec_start's result is no command's end")
}

func TestCallErrorJSONSaysTheTypeOnce(t *testing.T) {
	e := &reconnect.Error{Code: -32004, Type: "BoxSessionNotFoundError", Message: "BoxSessionNotFoundError: session nope not found",
		Data: json.RawMessage(`{"type":"BoxSessionNotFoundError","retryable":false,"session_id":"nope"}`)}
	assert.JSONEq(t, `{"error":{"code":-32004,"type":"BoxSessionNotFoundError","message":"session nope not found","retryable":false,"data":{"session_id":"nope"}}}`,
		string(callErrorJSON(e, time.Minute)))
	e.Data = json.RawMessage(`{"type":"BoxSessionNotFoundError","retryable":false}`)
	assert.JSONEq(t, `{"error":{"code":-32004,"type":"BoxSessionNotFoundError","message":"session nope not found","retryable":false,"data":null}}`,
		string(callErrorJSON(e, time.Minute)))
}

func TestPrintSessions(t *testing.T) {
	now := time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	printSessions(&b, []reconnect.SessionInfo{
		{SessionID: "a", State: "running", BackendName: "bwrap", CreatedAt: now.Add(-3 * time.Hour), LastUsedAt: now.Add(-90 * time.Second)},
		{SessionID: "long-name", State: "suspended", BackendName: "docker", Image: "img:1", CreatedAt: now.Add(-72 * time.Hour), LastUsedAt: now.Add(-5 * time.Second)},
	}, now)
	assert.Equal(t, ""+
		"SESSION    STATE      BACKEND  AGE  IDLE  IMAGE\n"+
		"a          running    bwrap    3h   1m    -\n"+
		"long-name  suspended  docker   3d   5s    img:1\n", b.String())
}

func TestHelpQuickStartNamesThisUsersToken(t *testing.T) {
	t.Setenv("BOXRT_STATE_DIR", "/some/state")
	assert.Contains(t, description(), `-H "Authorization: Bearer $(cat /some/state/control-token)"`)
}
