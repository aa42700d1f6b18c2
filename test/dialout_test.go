package test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/reconnect"
)

const dialToken = "dial-out-test-token-0123456789abcdef"

// dialHost is a host built on reconnect.Listener, on loopback. Its
// listener remembers the TCP connections it accepted, so a test can cut
// them (the network dropping the runtime's WebSocket).
type dialHost struct {
	L     *reconnect.Listener
	URL   string
	addr  string
	srv   *http.Server
	mu    sync.Mutex
	conns []net.Conn
}

type trackingListener struct {
	net.Listener
	h *dialHost
}

func (l trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.h.mu.Lock()
		l.h.conns = append(l.h.conns, c)
		l.h.mu.Unlock()
	}
	return c, err
}

func startDialHost(t *testing.T, addr string, tokens ...string) *dialHost {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	var err error
	// A restarted host takes its old port back as soon as it is free.
	require.Eventually(t, func() bool { ln, err = net.Listen("tcp", addr); return err == nil }, 10*time.Second, 50*time.Millisecond)
	L, err := reconnect.NewListener(tokens, reconnect.WithHeartbeat(2*time.Second, 2*time.Second, 3))
	require.NoError(t, err)
	h := &dialHost{L: L, addr: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.Handle("GET /boxrt/connect", L)
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	h.URL = "ws://" + h.addr + "/boxrt/connect"
	go func() { _ = h.srv.Serve(trackingListener{ln, h}) }()
	t.Cleanup(h.stop)
	return h
}

// cut closes every TCP connection the host accepted, under both ends.
func (h *dialHost) cut() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		_ = c.Close()
	}
	h.conns = nil
}

func (h *dialHost) stop() {
	_ = h.srv.Close()
	h.cut()
	_ = h.L.Close()
}

func (h *dialHost) accept(t *testing.T) *reconnect.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := h.L.Accept(ctx)
	require.NoError(t, err, "no runtime dialed in")
	return c
}

// dialRuntime runs `boxrt serve --connect`.
type dialRuntime struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	code   int
}

func startDialRuntime(t *testing.T, url, token, backend string) *dialRuntime {
	t.Helper()
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokFile, []byte(token+"\n"), 0o600))
	state := filepath.Join(dir, "state")
	cmd := exec.Command(binPath, "serve", "--connect", url, "--token-file", tokFile, "--state-dir", state,
		"--keepalive", "2s", "--log-level", "debug")
	cmd.Env = append(os.Environ(), "BOXRT_CONFIG={"+backendConfigs[backend]+"}")
	r := &dialRuntime{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = r.stderr
	require.NoError(t, cmd.Start())
	go func() {
		_ = cmd.Wait()
		r.code = cmd.ProcessState.ExitCode()
		close(r.done)
	}()
	t.Cleanup(func() { reapSandboxes(t, state) })
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			t.Logf("boxrt stderr:\n%s", lastLines(r.stderr.String(), 60))
		}
	})
	return r
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestDialOut drives a real boxrt on bwrap and on docker that dialed a
// host built on reconnect.Listener: calls, streamed exec output, files and
// the relay through the same connection, an exec whose connection is cut
// while it runs, and a host restart.
func TestDialOut(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) { testDialOut(t, backend) })
	}
}

func testDialOut(t *testing.T, backend string) {
	host := startDialHost(t, "", dialToken)
	rt := startDialRuntime(t, host.URL, dialToken, backend)
	c := host.accept(t)
	assert.NotEmpty(t, c.RuntimeID())
	ctx := callCtx(t)

	_, err := c.CreateSession(ctx, reconnect.ExecSpec{SessionID: "dial"})
	require.NoError(t, err)
	cur := c // the host's Client of the runtime, a new one after the restart
	t.Cleanup(func() { _ = cur.DeleteSession(context.Background(), "dial") })
	res, err := c.Exec(ctx, reconnect.ExecSpec{SessionID: "dial", Cmd: "echo hi"})
	require.NoError(t, err)
	assert.Equal(t, "hi\n", res.Stdout)

	t.Run("streaming", func(t *testing.T) {
		var mu sync.Mutex
		var chunks int
		var out bytes.Buffer
		res, err := c.ExecStream(ctx, reconnect.ExecSpec{SessionID: "dial", Cmd: "for i in 1 2 3; do echo line$i; sleep 0.2; done"}, func(o reconnect.ExecOutput) {
			mu.Lock()
			defer mu.Unlock()
			chunks++
			out.Write(o.Data)
		})
		require.NoError(t, err)
		assert.Equal(t, "completed", res.Status)
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, "line1\nline2\nline3\n", out.String())
		assert.GreaterOrEqual(t, chunks, 3, "output arrives as it is written")
	})

	t.Run("files over a stream", func(t *testing.T) {
		payload := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: several windows
		n, err := c.Upload(ctx, "dial", "/tmp/big.bin", bytes.NewReader(payload), 0o644)
		require.NoError(t, err)
		assert.Equal(t, int64(len(payload)), n)
		var got bytes.Buffer
		_, err = c.Download(ctx, "dial", "/tmp/big.bin", &got)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(payload, got.Bytes()), "downloaded %d bytes", got.Len())
	})

	t.Run("relay over a stream", func(t *testing.T) {
		info, err := c.StartProcess(ctx, "dial", reconnect.ProcessSpec{ProcessID: "echo", Command: "cat"})
		require.NoError(t, err)
		base, hc := c.HTTP()
		ws, _, err := websocket.Dial(ctx, base+"/v1/sessions/dial/managed-process/echo/ws", &websocket.DialOptions{
			HTTPClient: hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + info.RelayToken}}, Subprotocols: []string{"mcp"}})
		require.NoError(t, err)
		defer ws.CloseNow()
		writeText(t, ws, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		assert.Equal(t, `{"jsonrpc":"2.0","id":1,"method":"ping"}`, readText(t, ws))
	})

	t.Run("connection cut mid-exec", func(t *testing.T) {
		type outcome struct {
			res reconnect.ExecResult
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := c.Exec(ctx, reconnect.ExecSpec{SessionID: "dial", Cmd: "sleep 3; echo finished"})
			done <- outcome{res, err}
		}()
		time.Sleep(time.Second)
		host.cut()
		o := <-done
		require.NoError(t, o.err, "the answer made while the connection was down arrives after the resumption")
		assert.Equal(t, "finished\n", o.res.Stdout)
		assert.Equal(t, 1, c.Status().Connects, "the same logical connection was resumed")
		assert.Contains(t, rt.stderr.String(), "dial-out: connection resumed")
		res, err := c.Exec(ctx, reconnect.ExecSpec{SessionID: "dial", Cmd: "echo after"})
		require.NoError(t, err)
		assert.Equal(t, "after\n", res.Stdout)
	})

	t.Run("host restart", func(t *testing.T) {
		addr := host.addr
		host.stop()
		time.Sleep(500 * time.Millisecond) // the runtime's first redials meet a closed port
		host2 := startDialHost(t, addr, dialToken)
		c2 := host2.accept(t)
		cur = c2
		var sess map[string]any
		require.NoError(t, c2.Call(ctx, "box_get_session", map[string]any{"session_id": "dial"}, &sess), "sessions outlive the host")
		res, err := c2.Exec(ctx, reconnect.ExecSpec{SessionID: "dial", Cmd: "cat /tmp/big.bin | wc -c"})
		require.NoError(t, err)
		assert.Equal(t, "1048576", strings.TrimSpace(res.Stdout))

		// The runtime shutting down says so (1001): the host's call in
		// flight fails at once instead of waiting for a resumption.
		errc := make(chan error, 1)
		go func() {
			_, err := c2.Exec(ctx, reconnect.ExecSpec{SessionID: "dial", Cmd: "sleep 60"})
			errc <- err
		}()
		time.Sleep(time.Second)
		require.NoError(t, rt.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-errc:
			assert.ErrorIs(t, err, reconnect.ErrRuntimeUnavailable)
		case <-time.After(20 * time.Second):
			t.Fatal("the call in flight still waits after the runtime went away")
		}
		<-rt.done
		assert.Equal(t, 0, rt.code)
	})
}

// TestDialOutRefusals: a wrong token is refused by the host, and boxrt
// refuses a token in the URL, a missing token and clear ws:// to a remote
// host before dialing anything.
func TestDialOutRefusals(t *testing.T) {
	t.Run("wrong token", func(t *testing.T) {
		host := startDialHost(t, "", dialToken)
		rt := startDialRuntime(t, host.URL, "another-token-that-is-long-enough-0123456789", "bwrap")
		require.Eventually(t, func() bool { return strings.Contains(rt.stderr.String(), "refused the control token (HTTP 401)") },
			30*time.Second, 100*time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := host.L.Accept(ctx)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "no Client for a runtime with a wrong token")
	})
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokFile, []byte(dialToken), 0o600))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"token in the query", []string{"--connect", "ws://127.0.0.1:9/x?token=" + dialToken, "--token-file", tokFile}, "must not carry a token"},
		{"credentials in the URL", []string{"--connect", "wss://me:" + dialToken + "@host.example/x", "--token-file", tokFile}, "must not carry credentials"},
		{"no token", []string{"--connect", "ws://127.0.0.1:9/x"}, "--connect needs a control token"},
		{"clear text to a remote host", []string{"--connect", "ws://host.example/x", "--token-file", tokFile}, "use wss://"},
		{"with stdio", []string{"--connect", "ws://127.0.0.1:9/x", "--token-file", tokFile, "--stdio"}, "use one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(binPath, append([]string{"serve", "--state-dir", t.TempDir()}, tc.args...)...)
			cmd.Env = append(os.Environ(), "BOXRT_CONTROL_TOKEN=", "LANGBOT_BOX_CONTROL_TOKEN=")
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "%s", out)
			assert.Equal(t, 2, ee.ExitCode())
			assert.Contains(t, string(out), tc.want)
			assert.NotContains(t, string(out), dialToken+"\n", "the token is not echoed")
		})
	}
}
