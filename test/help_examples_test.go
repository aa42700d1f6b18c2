package test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helpExampleSubs make the commands of the --help examples run on this
// machine without changing their shape: the remote runtime they name is
// the local one (with its token file), a placeholder exec id a real one.
// Each must be used by some example, so the table cannot outlive them.
func helpExampleSubs(u *userEnv, configFile, execID string) []string {
	return []string{
		"https://box.internal:5410", "http://127.0.0.1:5410",
		"ws://box.internal:5410", "ws://127.0.0.1:5410",
		"/run/secrets/boxrt", filepath.Join(u.state, "control-token"),
		"/etc/boxrt.yaml", configFile,
		`"x-…"`, `"` + execID + `"`,
	}
}

// helpExample is a command line the description of `boxrt CMD --help`
// shows: an indented line that runs boxrt (a pipe into it included).
var helpExample = regexp.MustCompile(`^(boxrt |echo .*\| boxrt )`)

// helpDescriptions returns every subcommand's --help description, by
// command, the commands as `boxrt --help` lists them.
func helpDescriptions(t *testing.T, u *userEnv) map[string]string {
	t.Helper()
	top, _, code := u.run(t, "boxrt --help")
	require.Equal(t, 0, code)
	_, list, ok := strings.Cut(top, "COMMANDS:")
	require.True(t, ok, top)
	list, _, _ = strings.Cut(list, "GLOBAL OPTIONS:")
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(list))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] == "help," || f[0] == "help" {
			continue
		}
		help, _, code := u.run(t, "boxrt "+f[0]+" --help")
		require.Equal(t, 0, code, f[0])
		_, desc, _ := strings.Cut(help, "DESCRIPTION:")
		desc, _, _ = strings.Cut(desc, "OPTIONS:")
		out[f[0]] = desc
	}
	require.Contains(t, out, "call")
	return out
}

// TestHelpExamples runs every example command of every subcommand's
// --help, as written (see helpExampleSubs), against a real runtime on
// bwrap and on docker: each must exit 0 without an error answer. serve's configuration
// example is the configuration of a runtime that must start.
func TestHelpExamples(t *testing.T) {
	onEachBackend(t, helpExamples)
}

func helpExamples(t *testing.T, backend string) {
	if backend == "docker" {
		// A new user's sessions run in the default image.
		backend = "docker-default"
	}
	u := newUserEnv(t, backend)
	descs := helpDescriptions(t, u)

	// serve's example configuration starts a runtime (its own state
	// directory and a free port, before the one the examples use).
	_, cfg, ok := strings.Cut(descs["serve"], "for example:")
	require.True(t, ok, "serve --help has no configuration example")
	cfg, _, _ = strings.Cut(cfg, "\n\n")
	require.True(t, json.Valid([]byte(cfg)), "serve's example configuration is not JSON: %s", cfg)
	cfgFile := filepath.Join(u.dir, "example-config.json")
	require.NoError(t, os.WriteFile(cfgFile, []byte(cfg), 0o644))
	u.serve(t, "boxrt serve --listen 127.0.0.1:0 --state-dir "+filepath.Join(u.dir, "example-state")+" --config "+cfgFile)

	u.serve(t, "boxrt serve")
	// What the examples work on: a file to upload, a report and a test script
	// in session s1, a background exec to attach to.
	require.NoError(t, os.WriteFile(filepath.Join(u.dir, "data.csv"), []byte("a,b\n1,2\n"), 0o644))
	setup := `boxrt exec s1 -- 'mkdir -p /workspace/out && echo report > /workspace/out/report.pdf && echo "echo tested" > /workspace/test.sh'`
	_, stderr, code := u.run(t, setup)
	require.Equal(t, 0, code, stderr)
	started, stderr, code := u.run(t, `boxrt call box_exec_start '{"session_id":"s1","cmd":"echo attached"}'`)
	require.Equal(t, 0, code, stderr)
	var info struct {
		ExecID string `json:"exec_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(started), &info), started)
	require.NotEmpty(t, info.ExecID, started)
	empty := filepath.Join(u.dir, "boxrt.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("{}\n"), 0o644))
	subs := helpExampleSubs(u, empty, info.ExecID)
	used := make([]bool, len(subs)/2)

	ran := map[string]int{}
	for cmd, desc := range descs {
		sc := bufio.NewScanner(strings.NewReader(desc))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if !helpExample.MatchString(line) {
				continue
			}
			for i := 0; i < len(subs); i += 2 {
				if strings.Contains(line, subs[i]) {
					line, used[i/2] = strings.ReplaceAll(line, subs[i], subs[i+1]), true
				}
			}
			stdout, stderr, code := u.run(t, line)
			assert.Equal(t, 0, code, "boxrt %s --help: %s\nstdout: %s\nstderr: %s", cmd, line, stdout, stderr)
			assert.NotContains(t, stdout, `"error"`, "boxrt %s --help: %s", cmd, line)
			ran[cmd]++
		}
	}
	for i, ok := range used {
		assert.True(t, ok, "no --help example names %q any more", subs[2*i])
	}
	for _, cmd := range []string{"call", "cp", "exec", "sessions"} {
		assert.Positive(t, ran[cmd], "boxrt %s --help shows no example", cmd)
	}
	t.Logf("examples run: %v", ran)
	assert.FileExists(t, filepath.Join(u.dir, "report.pdf"), "cp's download example")
}

// onEachBackend runs fn as a subtest per backend a new user may have:
// bwrap, and docker with its default image.
func onEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "docker" {
				requireDockerImage(t)
			}
			fn(t, backend)
		})
	}
}
