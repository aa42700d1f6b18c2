package test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kubeconfigForTests is the test cluster's kubeconfig: $BOXRT_TEST_KUBECONFIG
// (scripts/test sets it), else what scripts/kube-up (idempotent) prints.
func kubeconfigForTests(t *testing.T) string {
	t.Helper()
	if k := os.Getenv("BOXRT_TEST_KUBECONFIG"); k != "" {
		return k
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join("..", "scripts", "kube-up")).Output()
	require.NoError(t, err, "scripts/kube-up: the kube tests need the test cluster")
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	k, ok := strings.CutPrefix(lines[len(lines)-1], "KUBECONFIG=")
	require.True(t, ok, "scripts/kube-up must end with KUBECONFIG=<path>: %q", lines[len(lines)-1])
	return k
}

// kubeTestConfig is boxrt's config for a kube test: namespace default of
// the test cluster under a fresh instance (so no test sees another's Pods),
// the tests' image, and the extra top-level keys given.
func kubeTestConfig(t *testing.T, kubeconfig, instancePrefix string, extra map[string]any) (cfg, instance string) {
	t.Helper()
	buf := make([]byte, 6)
	_, _ = rand.Read(buf)
	instance = instancePrefix + hex.EncodeToString(buf)
	conf := map[string]any{
		"backend": "kube",
		"kube": map[string]any{"kubeconfig": kubeconfig, "namespace": "default", "instance": instance,
			"image": "boxrt-test:busybox", "image_pull_policy": "Never"},
	}
	maps.Copy(conf, extra)
	raw, err := json.Marshal(conf)
	require.NoError(t, err)
	return string(raw), instance
}

// uploadByExec writes a file into a session the way a host without file
// methods would: gzip + base64 in chunks small enough for one argv string
// (Linux caps one argument at 128 KiB), then decoded inside the sandbox.
func uploadByExec(t *testing.T, p *Proc, session func(map[string]any) map[string]any, path string, data []byte) {
	t.Helper()
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, err := w.Write(data)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	text := base64.StdEncoding.EncodeToString(gz.Bytes())
	const chunk = 96 << 10 // a multiple of 4: chunks decode as one stream
	p.MustCall("box_exec", session(map[string]any{"cmd": "rm -f /tmp/upload.b64"}), nil)
	for off := 0; off < len(text); off += chunk {
		part := text[off:min(off+chunk, len(text))]
		var r map[string]any
		p.MustCall("box_exec", session(map[string]any{"cmd": "printf '%s' " + part + " >> /tmp/upload.b64"}), &r)
		require.Equal(t, float64(0), r["exit_code"], "%v", r)
	}
	var r map[string]any
	p.MustCall("box_exec", session(map[string]any{
		"cmd": fmt.Sprintf("base64 -d /tmp/upload.b64 | gunzip > %s && chmod +x %s && rm /tmp/upload.b64", path, path)}), &r)
	require.Equal(t, float64(0), r["exit_code"], "%v", r)
}

// mcpOverRelay speaks MCP to the managed process sid/default through the
// relay of p and checks both fixture tools.
func mcpOverRelay(t *testing.T, e *relayEnv, sid string) {
	t.Helper()
	c, _ := e.dial(t, sid, "default")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := mcpAdd(ctx, t, c)
	defer cs.Close()
	read, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "/workspace/f"}})
	require.NoError(t, err)
	require.False(t, read.IsError, "%v", read.Content)
	assert.Contains(t, mustJSON(t, read.StructuredContent), "kept")
}

// TestKubeReplicaKillAndRelay runs the built binary on the kube backend:
// a session with a real MCP server behind the relay; then boxrt is killed
// with SIGKILL and another replica (another state dir, the same
// kube.instance) re-adopts the session from the API server and serves it,
// relay and MCP included; deleting it leaves no session behind.
func TestKubeReplicaKillAndRelay(t *testing.T) {
	kubeconfig := kubeconfigForTests(t)
	cfg, _ := kubeTestConfig(t, kubeconfig, "e2e-", map[string]any{"limits": map[string]any{"session_ttl_sec": 300}})
	replica := func() *relayEnv {
		p := Start(t, Options{Stdio: true, Config: cfg})
		var health struct {
			RelayToken string `json:"relay_token"`
		}
		p.MustCall("box_health", map[string]any{}, &health)
		return &relayEnv{p: p, token: health.RelayToken, procs: map[string]string{}}
	}

	bin := filepath.Join(t.TempDir(), "mcpserver")
	build := exec.Command("go", "build", "-ldflags", "-s -w", "-o", bin, "./fixtures/mcpserver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	data, err := os.ReadFile(bin)
	require.NoError(t, err)

	// Every call names the session's spec, as a host does.
	session := func(m map[string]any) map[string]any {
		m["session_id"], m["persistent"] = "kube-e2e", true
		return m
	}
	first := replica()
	var created struct {
		BackendName      string `json:"backend_name"`
		BackendSessionID string `json:"backend_session_id"`
	}
	first.p.MustCall("box_create_session", session(map[string]any{}), &created)
	require.Equal(t, "kube", created.BackendName)
	// The replica alive when the test stops early deletes the session
	// (cleanups run before the replica's own stop, registered earlier).
	live := first
	cleanupBy := func(e *relayEnv) {
		t.Cleanup(func() {
			if live == e {
				e.p.Call("box_delete_session", map[string]any{"session_id": "kube-e2e"}, time.Minute)
			}
		})
	}
	cleanupBy(first)
	first.p.MustCall("box_exec", session(map[string]any{"cmd": "echo kept > /workspace/f"}), nil)
	uploadByExec(t, first.p, session, "/workspace/mcpserver", data)
	first.start(t, "kube-e2e", "default", "/workspace/mcpserver")
	mcpOverRelay(t, first, "kube-e2e")

	first.p.Kill() // SIGKILL: no shutdown path runs

	second := replica()
	live = second
	cleanupBy(second)
	var got map[string]any
	second.p.MustCall("box_get_session", map[string]any{"session_id": "kube-e2e"}, &got)
	assert.Equal(t, created.BackendSessionID, got["backend_session_id"], "the same Pod, adopted: %v", got)
	var r map[string]any
	second.p.MustCall("box_exec", session(map[string]any{"cmd": "cat /workspace/f"}), &r)
	assert.Equal(t, "kept\n", r["stdout"])
	second.start(t, "kube-e2e", "default", "/workspace/mcpserver")
	mcpOverRelay(t, second, "kube-e2e")

	second.p.MustCall("box_delete_session", map[string]any{"session_id": "kube-e2e"}, nil)
	live = nil
	third := replica()
	var sessions map[string]any
	third.p.MustCall("box_get_sessions", map[string]any{}, &sessions)
	assert.NotContains(t, mustJSON(t, sessions), "kube-e2e", "a deleted session is not adopted again")
}

// TestKubeLiveExecAndFiles runs the built binary on the kube backend: a
// command on a terminal with a resize and typed input, then the file API
// (write, ranged read, stat, a symlink escape refused) over JSON-RPC.
func TestKubeLiveExecAndFiles(t *testing.T) {
	cfg, _ := kubeTestConfig(t, kubeconfigForTests(t), "e2e-", map[string]any{"limits": map[string]any{"session_ttl_sec": 300}})
	p := Start(t, Options{Stdio: true, Config: cfg})
	e := &liveEnv{backend: "kube", p: p, c: stdioLive(t, p)}
	s := e.session(t, "kube-live", nil)

	t.Run("terminal", func(t *testing.T) { e.ptyResize(t, s) })

	t.Run("files", func(t *testing.T) {
		data := []byte("\x00\x01binary\xff\xfe\n")
		e.c.call("box_fs_write", with(s, "path", "/workspace/d/a.bin", "data_base64", base64.StdEncoding.EncodeToString(data), "mode", 0o640), nil)
		var rd struct {
			DataBase64 string `json:"data_base64"`
			Size       int64  `json:"size"`
		}
		e.c.call("box_fs_read", with(s, "path", "/workspace/d/a.bin", "offset", 2, "length", 6), &rd)
		got, _ := base64.StdEncoding.DecodeString(rd.DataBase64)
		assert.Equal(t, "binary", string(got))
		assert.EqualValues(t, len(data), rd.Size)
		var st struct {
			Type string `json:"type"`
			Mode uint32 `json:"mode"`
		}
		e.c.call("box_fs_stat", with(s, "path", "/workspace/d/a.bin"), &st)
		assert.Equal(t, "file", st.Type)
		assert.EqualValues(t, 0o640, st.Mode)
		e.c.call("box_exec", with(s, "cmd", "ln -s /etc/passwd /workspace/x"), nil)
		_, ch := e.c.start("box_fs_read", with(s, "path", "/workspace/x"))
		r := e.c.await(ch, "box_fs_read")
		require.NotNil(t, r.Error, "a link out of the mounts must be refused")
		assert.Equal(t, "BoxValidationError", r.Error.Type(), "%+v", r.Error)
	})
}
