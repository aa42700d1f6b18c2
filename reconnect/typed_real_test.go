//go:build unix

package reconnect

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRealTypedCalls drives a bwrap-backed boxrt through the typed calls
// only: a session, a command, a live exec fed through its stdin, one
// killed, a managed process, and the session's end.
func TestRealTypedCalls(t *testing.T) {
	needRealBinary(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Spawn(ctx, WithCommand(realBin, "serve", "--stdio", "--listen", ""),
		WithEnv(append(os.Environ(), `BOXRT_CONFIG={"backend":"bwrap"}`)), WithStderr(stderr))
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()

	s, err := c.CreateSession(ctx, ExecSpec{SessionID: "typed", Env: map[string]string{"IGNORED": "x"}})
	require.NoError(t, err)
	assert.True(t, s.SessionCreated)
	assert.Equal(t, "bwrap", s.BackendName)
	assert.Equal(t, "/workspace", s.MountPath)
	assert.Equal(t, "running", s.State)

	res, err := c.Exec(ctx, ExecSpec{SessionID: "typed", Cmd: "echo $GREETING; echo oops >&2; exit 3", Env: map[string]string{"GREETING": "hi"}})
	require.NoError(t, err)
	assert.Equal(t, "completed", res.Status)
	require.NotNil(t, res.ExitCode)
	assert.Equal(t, 3, *res.ExitCode)
	assert.Equal(t, "hi\n", res.Stdout)
	assert.Equal(t, "oops\n", res.Stderr)
	assert.False(t, res.SessionCreated)

	upper, err := c.StartExec(ctx, ExecSpec{SessionID: "typed", Cmd: "read l; echo \"got:$l\""}, true)
	require.NoError(t, err)
	assert.Equal(t, "running", upper.Status)
	assert.True(t, upper.Stdin)
	n, err := c.WriteStdin(ctx, upper.ExecID, []byte("hello\n"), true)
	require.NoError(t, err)
	assert.Equal(t, 6, n)
	res, err = c.WaitExec(ctx, upper.ExecID, 0)
	require.NoError(t, err)
	assert.Equal(t, "completed", res.Status)
	assert.Equal(t, "got:hello\n", res.Stdout)

	sleeper, err := c.StartExec(ctx, ExecSpec{SessionID: "typed", Cmd: "echo started; sleep 60"}, false)
	require.NoError(t, err)
	res, err = c.WaitExec(ctx, sleeper.ExecID, 300*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, "running", res.Status)
	assert.Nil(t, res.ExitCode)
	execs, err := c.ListExecs(ctx, "typed")
	require.NoError(t, err)
	require.Len(t, execs, 2)
	assert.Equal(t, upper.ExecID, execs[0].ExecID)
	assert.Equal(t, "running", execs[1].Status)
	killed, err := c.KillExec(ctx, sleeper.ExecID, "")
	require.NoError(t, err)
	assert.Equal(t, "canceled", killed.Status)
	assert.NotNil(t, killed.EndedAt)

	p, err := c.StartProcess(ctx, "typed", ProcessSpec{ProcessID: "echo", Command: "sh", Args: []string{"-c", "echo warn >&2; cat"}, Env: map[string]string{"K": "v"}})
	require.NoError(t, err)
	assert.Equal(t, "running", p.Status)
	assert.Equal(t, []string{"K"}, p.EnvKeys)
	assert.NotEmpty(t, p.RelayToken)
	waitFor(t, 10*time.Second, "the process's stderr preview", func() bool {
		got, err := c.GetProcess(ctx, "typed", "echo")
		return err == nil && got.StderrPreview == "warn"
	})
	got, err := c.GetSession(ctx, "typed")
	require.NoError(t, err)
	assert.Equal(t, "running", got.ManagedProcesses["echo"].Status)
	require.NoError(t, c.StopProcess(ctx, "typed", "echo"))
	_, err = c.GetProcess(ctx, "typed", "echo")
	assert.ErrorIs(t, err, ErrProcessNotFound)

	all, err := c.ListSessions(ctx)
	require.NoError(t, err)
	require.Len(t, all, 1)
	assert.Equal(t, "typed", all[0].SessionID)
	require.NoError(t, c.DeleteSession(ctx, "typed"))
	_, err = c.GetSession(ctx, "typed")
	assert.ErrorIs(t, err, ErrSessionNotFound)
}
