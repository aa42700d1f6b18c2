package test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKilledRuntimeLeavesNoOrphans: boxrt is killed with SIGKILL while a
// managed process runs in a docker session. The process outlives it (it
// ignores stdin EOF); the next boxrt, which re-adopts the container but
// cannot know the process, kills it.
func TestKilledRuntimeLeavesNoOrphans(t *testing.T) {
	state := t.TempDir()
	removeInstanceContainers(t, state)
	opts := Options{Stdio: true, StateDir: state, Config: "{" + backendConfigs["docker"] + "}"}
	p := Start(t, opts)
	var info struct {
		BackendSessionID string `json:"backend_session_id"`
	}
	p.MustCall("box_create_session", map[string]any{"session_id": "orphans", "persistent": true}, &info)
	p.MustCall("box_start_managed_process", map[string]any{"session_id": "orphans",
		"spec": map[string]any{"command": "sleep", "args": []string{"4321"}}}, nil)

	p.Kill()
	orphan := func() bool {
		out, err := exec.Command("docker", "exec", info.BackendSessionID, "ps", "-o", "args").CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.Contains(string(out), "sleep 4321")
	}
	require.True(t, orphan(), "the managed process survives the killed runtime")

	p2 := Start(t, opts)
	r := execIn(t, p2, map[string]any{"session_id": "orphans", "persistent": true, "cmd": "echo adopted"})
	assert.Equal(t, "adopted\n", r.Stdout, "the session is re-adopted, not recreated")
	assert.Eventually(t, func() bool { return !orphan() }, 20*time.Second, 100*time.Millisecond,
		"the orphaned managed process is killed on adoption")
	p2.MustCall("box_delete_session", map[string]any{"session_id": "orphans"}, nil)
}
