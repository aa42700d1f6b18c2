//go:build unix

package reconnect

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRealSpawnDefaultLeavesTheServerAlone: a host spawns boxrt with
// Spawn's defaults next to a boxrt serving on the state directory the
// host's environment names. The child gets a private directory instead:
// another instance id, the server's session untouched, and at Close its
// own sessions, persistent ones too, and the directory are gone.
func TestRealSpawnDefaultLeavesTheServerAlone(t *testing.T) {
	needRealBinary(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	state, tmp := t.TempDir(), t.TempDir()
	addr, token := startServe(t, state, stderr)
	server, err := Dial(ctx, "ws://"+addr, WithToken(token))
	require.NoError(t, err)
	defer server.Close()
	requireBackend(t, server)
	var serverStatus, childStatus struct {
		InstanceID string `json:"instance_id"`
		Backend    struct {
			Name string `json:"name"`
		} `json:"backend"`
	}
	require.NoError(t, server.Call(ctx, "box_status", struct{}{}, &serverStatus))
	defer removeInstance(serverStatus.InstanceID)
	require.NoError(t, server.Call(ctx, "box_exec", map[string]any{"session_id": "keep", "cmd": "echo kept > /workspace/f"}, nil))

	// Inherited, not WithEnv: the environment a host runs in, which is
	// not a choice of state directory for the child.
	t.Setenv("BOXRT_STATE_DIR", state)
	t.Setenv("BOXRT_CONFIG", strings.TrimPrefix(realEnv()[len(realEnv())-1], "BOXRT_CONFIG="))
	t.Setenv("TMPDIR", tmp)
	child, err := Spawn(ctx, WithCommand(realBin, "serve", "--stdio", "--listen", ""), WithStderr(stderr))
	require.NoError(t, err)
	require.NoError(t, child.Call(ctx, "box_status", struct{}{}, &childStatus))
	defer removeInstance(childStatus.InstanceID)
	require.NotEqual(t, serverStatus.InstanceID, childStatus.InstanceID, "the child runs on its own state directory")
	require.NoError(t, child.Call(ctx, "box_exec", map[string]any{"session_id": "mine", "cmd": "true", "persistent": true}, nil))
	require.NoError(t, child.Close())

	var res struct {
		Stdout         string `json:"stdout"`
		SessionCreated *bool  `json:"session_created"`
	}
	require.NoError(t, server.Call(ctx, "box_exec", map[string]any{"session_id": "keep", "cmd": "cat /workspace/f"}, &res))
	assert.Equal(t, "kept\n", res.Stdout, "the server's session kept its workspace")
	require.NotNil(t, res.SessionCreated)
	assert.False(t, *res.SessionCreated)

	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	for _, e := range entries {
		assert.False(t, strings.HasPrefix(e.Name(), "boxrt-private-"), "private state directory %s left behind", e.Name())
	}
	if childStatus.Backend.Name == "docker" {
		assert.Empty(t, instanceContainers(t, childStatus.InstanceID), "the private runtime's persistent session ended with it")
	}
}

// instanceContainers lists the containers, in any state, of an instance.
func instanceContainers(t *testing.T, instance string) []string {
	t.Helper()
	out, err := exec.Command("docker", "ps", "-a", "-q", "--filter", "label=boxrt.instance="+instance).Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// removeInstance removes what a failed test may leave of an instance.
func removeInstance(instance string) {
	if instance == "" {
		return
	}
	out, _ := exec.Command("docker", "ps", "-a", "-q", "--filter", "label=boxrt.instance="+instance).Output()
	if ids := strings.Fields(string(out)); len(ids) > 0 {
		_ = exec.Command("docker", append([]string{"rm", "-f", "-v"}, ids...)...).Run()
	}
}

func TestChooseStateDir(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	t.Run("default: a private directory, removed by cleanup", func(t *testing.T) {
		o := defaultOptions()
		require.NoError(t, chooseStateDir(&o))
		last := o.env[len(o.env)-1]
		dir, ok := strings.CutPrefix(last, privateStateDirEnv+"=")
		require.True(t, ok, "env ends with %q", last)
		require.DirExists(t, dir)
		require.NotNil(t, o.cleanup)
		o.cleanup()
		require.NoDirExists(t, dir)
	})
	t.Run("WithStateDir", func(t *testing.T) {
		o := buildOptions([]Option{WithStateDir("/srv/boxrt-state")})
		require.NoError(t, chooseStateDir(&o))
		assert.Equal(t, stateDirEnv+"=/srv/boxrt-state", o.env[len(o.env)-1])
		assert.Nil(t, o.cleanup)
	})
	t.Run("WithEnv naming BOXRT_STATE_DIR", func(t *testing.T) {
		o := buildOptions([]Option{WithEnv([]string{"BOXRT_STATE_DIR=/x"})})
		require.NoError(t, chooseStateDir(&o))
		assert.Equal(t, []string{"BOXRT_STATE_DIR=/x"}, o.env)
		assert.Nil(t, o.cleanup)
	})
}
