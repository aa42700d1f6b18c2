package test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// durableBackends configure each real backend so that a session can
// "install a package" outside its workspace: docker runs the full sandbox
// image as root with a writable root filesystem (the tool goes to
// /usr/local/bin, the container's writable layer); bwrap's root is always
// read-only, so the tool goes to /home, the session's own disk.
var durableBackends = map[string]struct {
	config  string
	spec    map[string]any
	toolDir string
}{
	"docker": {
		config:  `"backend":"docker","docker":{"image":"boxrt-sandbox:latest","user":"0"}`,
		spec:    map[string]any{"read_only_rootfs": false},
		toolDir: "/usr/local/bin",
	},
	"bwrap": {config: `"backend":"bwrap"`, spec: map[string]any{}, toolDir: "/home/bin"},
}

func durableSpec(backend, id string, extra map[string]any) map[string]any {
	out := map[string]any{"session_id": id}
	for k, v := range durableBackends[backend].spec {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	return out
}

type sessionState struct {
	SessionID        string `json:"session_id"`
	BackendSessionID string `json:"backend_session_id"`
	State            string `json:"state"`
}

// installTool writes a file into the workspace and a small executable
// outside it, standing in for an installed package.
func installTool(backend string) string {
	dir := durableBackends[backend].toolDir
	return "echo kept > /workspace/f && mkdir -p " + dir + " && printf '#!/bin/sh\\necho tool-ok\\n' > " + dir +
		"/mytool && chmod +x " + dir + "/mytool"
}

func useTool(backend string) string {
	return "cat /workspace/f && " + durableBackends[backend].toolDir + "/mytool"
}

func dockerState(t *testing.T, container string) string {
	out, err := exec.Command("docker", "inspect", "-f", "{{.State.Status}}", container).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// TestSuspendSurvivesKill9 writes a file and installs a tool, suspends the
// session, kills boxrt with SIGKILL, restarts it on the same state
// directory and resumes through an exec: the file and the tool are there.
func TestSuspendSurvivesKill9(t *testing.T) {
	for _, backend := range []string{"docker", "bwrap"} {
		t.Run(backend, func(t *testing.T) {
			state := t.TempDir()
			removeInstanceContainers(t, state)
			opts := Options{Stdio: true, StateDir: state, Config: "{" + durableBackends[backend].config + "}"}
			p := Start(t, opts)
			res := execIn(t, p, durableSpec(backend, "d1", map[string]any{"cmd": installTool(backend)}))
			require.Equal(t, 0, *res.ExitCode, "%+v", res)

			var info sessionState
			p.MustCall("box_suspend_session", map[string]any{"session_id": "d1"}, &info)
			assert.Equal(t, "suspended", info.State)
			if backend == "docker" {
				assert.Equal(t, "exited", dockerState(t, info.BackendSessionID), "a suspended container does not run")
			}
			p.Kill()

			p2 := Start(t, opts)
			p2.MustCall("box_get_session", map[string]any{"session_id": "d1"}, &info)
			assert.Equal(t, "suspended", info.State, "the restarted boxrt adopted the suspended session")
			res = execIn(t, p2, durableSpec(backend, "d1", map[string]any{"cmd": useTool(backend)}))
			assert.Equal(t, "kept\ntool-ok\n", res.Stdout, "%+v", res)
			p2.MustCall("box_get_session", map[string]any{"session_id": "d1"}, &info)
			assert.Equal(t, "running", info.State)
			p2.MustCall("box_delete_session", map[string]any{"session_id": "d1"}, nil)
		})
	}
}
