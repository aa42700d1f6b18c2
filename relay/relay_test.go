package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeBackend starts fakeProcs and hands each to the test.
type fakeBackend struct{ started chan *fakeProc }

func (f *fakeBackend) Name() string                                      { return "fake" }
func (f *fakeBackend) Probe(context.Context) error                       { return nil }
func (f *fakeBackend) Describe() backends.Description                    { return backends.Description{Isolation: "none"} }
func (f *fakeBackend) DefaultImage() string                              { return "fake:latest" }
func (f *fakeBackend) Adopt(context.Context) ([]backends.Session, error) { return nil, nil }
func (f *fakeBackend) Alive(context.Context, backends.Session) bool      { return true }
func (f *fakeBackend) StopSession(context.Context, backends.Session) error {
	return nil
}
func (f *fakeBackend) StartSession(_ context.Context, spec backends.SandboxSpec) (backends.Session, error) {
	return spec.Session("fake", "box-"+spec.SessionID), nil
}
func (f *fakeBackend) Exec(context.Context, backends.Session, backends.ExecRequest) (backends.ExitStatus, error) {
	return backends.ExitStatus{}, nil
}
func (f *fakeBackend) StartProcess(context.Context, backends.Session, backends.ProcessSpec) (backends.Process, error) {
	p, err := newFakeProc()
	if err != nil {
		return nil, err
	}
	f.started <- p
	return p, nil
}

// fakeProc has real OS pipes, like the bwrap backend's processes: the test
// plays the process, writing its stdout (out) and reading its stdin (in)
// — or not reading it at all.
type fakeProc struct {
	stdin, stdout, stderr *os.File // boxrt's ends
	in                    *os.File // the process's stdin
	out                   *os.File // the process's stdout
	done                  chan struct{}
	once                  sync.Once
	code                  int
}

func newFakeProc() (*fakeProc, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errW.Close()
	return &fakeProc{stdin: inW, stdout: outR, stderr: errR, in: inR, out: outW, done: make(chan struct{})}, nil
}

func (p *fakeProc) Stdin() io.WriteCloser { return p.stdin }
func (p *fakeProc) Stdout() io.Reader     { return p.stdout }
func (p *fakeProc) Stderr() io.Reader     { return p.stderr }
func (p *fakeProc) Wait() (int, error)    { <-p.done; return p.code, nil }
func (p *fakeProc) Signal(sig syscall.Signal) error {
	p.exit(-int(sig))
	return nil
}

func (p *fakeProc) exit(code int) {
	p.once.Do(func() {
		p.code = code
		p.out.Close()
		p.in.Close()
		close(p.done)
	})
}

func (p *fakeProc) print(t *testing.T, s string) {
	t.Helper()
	_, err := io.WriteString(p.out, s)
	require.NoError(t, err)
}

// env is a runtime on the fake backend with the relay on a test server.
type env struct {
	t       testing.TB
	rt      *runtime.Runtime
	h       *Handler
	srv     *httptest.Server
	fb      *fakeBackend
	control string
}

const controlToken = "control-token-0123456789abcdefghijklmnop"

func newEnv(t testing.TB, patch string, opts ...Option) *env {
	t.Helper()
	return newEnvOn(t, nil, patch, opts...)
}

// newEnvOn is newEnv with the test server's connections wrapped by wrap
// (nil: as accepted).
func newEnvOn(t testing.TB, wrap func(net.Conn) net.Conn, patch string, opts ...Option) *env {
	t.Helper()
	cfg := runtime.DefaultConfig()
	if patch != "" {
		var err error
		cfg, _, err = cfg.Merge([]byte(patch), json.Unmarshal)
		require.NoError(t, err)
	}
	fb := &fakeBackend{started: make(chan *fakeProc, 16)}
	rt, err := runtime.New(cfg, func(string, runtime.Config, string, string) (backends.Backend, error) { return fb, nil }, t.TempDir())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	rt.Start(ctx)
	h := New(rt, append([]Option{WithOperator(rpc.NewAuthenticator(controlToken))}, opts...)...)
	mux := http.NewServeMux()
	mux.Handle("GET /v1/sessions/{session_id}/managed-process/{process_id}/ws", h)
	srv := httptest.NewUnstartedServer(mux)
	if wrap != nil {
		srv.Listener = wrappingListener{Listener: srv.Listener, wrap: wrap}
	}
	srv.Start()
	t.Cleanup(func() {
		closeCtx, cancelClose := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancelClose()
		assert.NoError(t, h.Close(closeCtx))
		srv.Close()
		require.NoError(t, rt.Close(context.Background()))
		cancel()
	})
	return &env{t: t, rt: rt, h: h, srv: srv, fb: fb, control: controlToken}
}

type wrappingListener struct {
	net.Listener
	wrap func(net.Conn) net.Conn
}

func (l wrappingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.wrap(c), nil
}

// start starts process pid in session sid and returns it with its relay
// token.
func (e *env) start(sid, pid string) (*fakeProc, string) {
	e.t.Helper()
	ctx := context.Background()
	_, err := e.rt.EnsureSession(ctx, runtime.Spec{SandboxSpec: backends.SandboxSpec{SessionID: sid}})
	require.NoError(e.t, err)
	info, err := e.rt.Processes().Start(ctx, sid, backends.ProcessSpec{ProcessID: pid, Command: "fake"})
	require.NoError(e.t, err)
	return <-e.fb.started, info.RelayToken
}

func (e *env) dial(sid, pid, token string) (*websocket.Conn, *http.Response) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/v1/sessions/" + sid + "/managed-process/" + pid + "/ws"
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	require.NoError(e.t, err)
	c.SetReadLimit(MaxMessageBytes + 1)
	e.t.Cleanup(func() { c.CloseNow() })
	return c, resp
}

func read(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, b, err := c.Read(ctx)
	require.NoError(t, err)
	return string(b)
}

// closed waits for the server to close c and returns the close status.
func closed(t *testing.T, c *websocket.Conn) websocket.CloseError {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, _, err := c.Read(ctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		require.ErrorAs(t, err, &ce, "closed by the server, not by the test's timeout")
		return ce
	}
}

func send(t *testing.T, c *websocket.Conn, s string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Write(ctx, websocket.MessageText, []byte(s))
}

// pending waits until the process has n lines waiting for an attacher.
func (e *env) pending(sid, pid string, n int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		info, err := e.rt.Processes().Get(context.Background(), sid, pid)
		return err == nil && info.PendingLines == n
	}, 10*time.Second, 5*time.Millisecond)
}

func TestRelayScenarios(t *testing.T) {
	tests := []struct {
		name  string
		patch string
		run   func(t *testing.T, e *env, p *fakeProc, tok string)
	}{
		{"one frame per line, split writes joined", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			c, _ := e.dial("s", "p", tok)
			p.print(t, "a\nb")
			p.print(t, "c\n\n")
			assert.Equal(t, []string{"a", "bc", ""}, []string{read(t, c), read(t, c), read(t, c)})
		}},
		{"stdin frames become lines", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			c, _ := e.dial("s", "p", tok)
			require.NoError(t, send(t, c, "one"))
			require.NoError(t, send(t, c, "two\n"))
			br := bufio.NewReader(p.in)
			for _, want := range []string{"one\n", "two\n"} {
				got, err := br.ReadString('\n')
				require.NoError(t, err)
				assert.Equal(t, want, got)
			}
		}},
		{"replay comes first, in order, then live lines", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			p.print(t, "1\n2\n3\n")
			e.pending("s", "p", 3)
			c, resp := e.dial("s", "p", tok)
			assert.Equal(t, "3", resp.Header.Get(HeaderReplayLines))
			assert.Equal(t, "0", resp.Header.Get(HeaderReplayDropped))
			p.print(t, "4\n")
			for _, want := range []string{"1", "2", "3", "4"} {
				assert.Equal(t, want, read(t, c))
			}
		}},
		{"replay bound by lines drops the oldest and counts them", `{"limits":{"relay_replay_lines":2}}`, func(t *testing.T, e *env, p *fakeProc, tok string) {
			p.print(t, "1\n2\n3\n4\n5\n")
			require.Eventually(t, func() bool {
				info, _ := e.rt.Processes().Get(context.Background(), "s", "p")
				return info.PendingLines == 2
			}, 10*time.Second, 5*time.Millisecond)
			time.Sleep(50 * time.Millisecond) // let the pump finish the burst
			c, resp := e.dial("s", "p", tok)
			assert.Equal(t, "2", resp.Header.Get(HeaderReplayLines))
			assert.Equal(t, "3", resp.Header.Get(HeaderReplayDropped))
			assert.Equal(t, []string{"4", "5"}, []string{read(t, c), read(t, c)})
		}},
		{"replay bound by bytes", `{"limits":{"relay_replay_bytes":8}}`, func(t *testing.T, e *env, p *fakeProc, tok string) {
			p.print(t, "aaaa\nbbbb\ncccc\nend\n")
			e.pending("s", "p", 2)
			c, resp := e.dial("s", "p", tok)
			assert.Equal(t, "2", resp.Header.Get(HeaderReplayDropped))
			assert.Equal(t, []string{"cccc", "end"}, []string{read(t, c), read(t, c)})
		}},
		{"latest attacher wins, the previous is closed 4001", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			a, _ := e.dial("s", "p", tok)
			b, _ := e.dial("s", "p", tok)
			ce := closed(t, a)
			assert.Equal(t, CloseTakenOver, ce.Code)
			assert.Equal(t, "taken over by a newer attach", ce.Reason)
			p.print(t, "for b\n")
			assert.Equal(t, "for b", read(t, b))
		}},
		{"takeovers in a row close each previous socket in order", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			var conns []*websocket.Conn
			for range 4 {
				c, _ := e.dial("s", "p", tok)
				conns = append(conns, c)
			}
			for _, c := range conns[:3] {
				assert.Equal(t, CloseTakenOver, closed(t, c).Code)
			}
			p.print(t, "last\n")
			assert.Equal(t, "last", read(t, conns[3]))
		}},
		{"process exit closes 1000 with its code after the output", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			c, _ := e.dial("s", "p", tok)
			p.print(t, "bye\n")
			assert.Equal(t, "bye", read(t, c))
			p.exit(7)
			ce := closed(t, c)
			assert.Equal(t, websocket.StatusNormalClosure, ce.Code)
			assert.Equal(t, "process exited with code 7", ce.Reason)
		}},
		{"an over-long line is reported once, then the next lines flow", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			go func() {
				_, _ = io.WriteString(p.out, "before\n"+strings.Repeat("x", MaxMessageBytes+1)+"\nafter\n")
			}()
			e.pending("s", "p", 3)
			c, _ := e.dial("s", "p", tok)
			assert.Equal(t, "before", read(t, c))
			ce := closed(t, c)
			assert.Equal(t, websocket.StatusMessageTooBig, ce.Code)
			c2, resp := e.dial("s", "p", tok)
			assert.Equal(t, "1", resp.Header.Get(HeaderReplayLines))
			assert.Equal(t, "after", read(t, c2))
		}},
		{"a process that stops reading stdin cannot hold the socket", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			e.h.stdinTimeout = 200 * time.Millisecond
			c, _ := e.dial("s", "p", tok)
			frame := strings.Repeat("x", 16<<10)
			// Nobody reads p.in: the pipe fills, the write times out and
			// the relay closes with 4002.
			go func() {
				for range 16 {
					if send(t, c, frame) != nil {
						return
					}
				}
			}()
			ce := closed(t, c)
			assert.Equal(t, CloseStdioUnavailable, ce.Code)
		}},
		{"a writer blocked on stdin ends at shutdown", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			before := goleak.IgnoreCurrent()
			c, _ := e.dial("s", "p", tok)
			fillStdin(t, c)
			closeErr := make(chan error, 1)
			go func() { closeErr <- e.h.Close(context.Background()) }()
			ce := closed(t, c)
			assert.Equal(t, websocket.StatusGoingAway, ce.Code)
			assert.Equal(t, "boxrt shutting down", ce.Reason)
			assert.NoError(t, <-closeErr)
			goleak.VerifyNone(t, before)
		}},
		{"a writer blocked on stdin ends with a dead peer", "", func(t *testing.T, e *env, p *fakeProc, tok string) {
			e.h.pingInterval, e.h.pingTimeout = 100*time.Millisecond, 100*time.Millisecond
			before := goleak.IgnoreCurrent()
			c, _ := e.dial("s", "p", tok)
			fillStdin(t, c)
			c.CloseNow() // gone without a close frame: only the keepalive can tell
			goleak.VerifyNone(t, before)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.patch)
			p, tok := e.start("s", "p")
			tc.run(t, e, p, tok)
		})
	}
}

// TestRelayCloseDrains: Close returns only once every bridge has ended, so
// that none detaches from or writes to a process the runtime stops after
// it; peers that do not answer the close, or bridges stuck writing to a
// peer that stopped reading, hold it no longer than its context.
func TestRelayCloseDrains(t *testing.T) {
	const sockets = 3
	tests := []struct {
		name    string
		timeout time.Duration
		// peersRead: the clients read, so they answer the close.
		peersRead bool
		// flood: every process writes stdout without end, and Close starts
		// once each bridge is blocked writing to its full socket.
		flood   bool
		wantErr error
	}{
		{"peers that answer the close", 10 * time.Second, true, false, nil},
		{"peers that never answer are cut when the context ends", 300 * time.Millisecond, false, false, context.DeadlineExceeded},
		{"bridges stuck writing to peers that stopped reading", 10 * time.Second, false, true, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			events := map[string]int{}
			e := newEnv(t, "", WithObserver(func(ev Event) {
				mu.Lock()
				defer mu.Unlock()
				events[ev.Kind]++
			}))
			var writers sync.WaitGroup
			var procs []*fakeProc
			peerErrs := make(chan error, sockets)
			for i := range sockets {
				pid := fmt.Sprintf("p%d", i)
				p, _ := e.start("s", pid)
				procs = append(procs, p)
				c, _ := e.dial("s", pid, e.control)
				if tc.peersRead {
					go func() {
						for {
							if _, _, err := c.Read(context.Background()); err != nil {
								peerErrs <- err
								return
							}
						}
					}()
				}
				if tc.flood {
					writers.Add(1)
					go func() {
						defer writers.Done()
						line := strings.Repeat("x", 16<<10) + "\n"
						for {
							if _, err := io.WriteString(p.out, line); err != nil {
								return
							}
						}
					}()
				}
			}
			if tc.flood {
				require.Eventually(t, func() bool { return blockedWriting() == sockets }, 20*time.Second, 10*time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			closeErr := make(chan error, 1)
			go func() { closeErr <- e.h.Close(ctx) }()
			select {
			case err := <-closeErr:
				assert.ErrorIs(t, err, tc.wantErr)
			case <-time.After(tc.timeout + 20*time.Second):
				t.Fatal("Close did not return")
			}
			mu.Lock()
			assert.Equal(t, sockets, events["attach"])
			assert.Equal(t, sockets, events["close"], "bridges still running when Close returned")
			mu.Unlock()
			assert.Equal(t, http.StatusServiceUnavailable, dialStatus(t, e, "s", "p0", e.control), "an attach after Close")
			if tc.peersRead {
				for range sockets {
					assert.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(<-peerErrs))
				}
			}
			for _, p := range procs {
				p.exit(0)
			}
			writers.Wait()
		})
	}
}

// shutdownOnWriteConn runs onMarker inside the first write that carries
// marker, after the bytes went out: a shutdown that lands between a
// batch's last write and the batch's end.
type shutdownOnWriteConn struct {
	net.Conn
	marker   []byte
	onMarker func()
	once     sync.Once
	// pastDeadline is closed when the write deadline is set in the past
	// (the bridge's abort of a batch).
	pastDeadline chan struct{}
	pastOnce     sync.Once
}

func (c *shutdownOnWriteConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil && bytes.Contains(p, c.marker) {
		c.once.Do(c.onMarker)
	}
	return n, err
}

func (c *shutdownOnWriteConn) SetWriteDeadline(t time.Time) error {
	if !t.IsZero() && t.Before(time.Now()) {
		c.pastOnce.Do(func() { close(c.pastDeadline) })
	}
	return c.Conn.SetWriteDeadline(t)
}

// TestRelayShutdownRightAfterABatch: Close lands after a batch's last
// write, before the batch has ended. The batch's abort must not leave the
// connection unable to write the close frame: the peer gets the line and
// then 1001, not a dropped connection.
func TestRelayShutdownRightAfterABatch(t *testing.T) {
	const marker = "last-line-before-shutdown"
	var e *env
	closeErr := make(chan error, 1)
	e = newEnvOn(t, func(c net.Conn) net.Conn {
		sc := &shutdownOnWriteConn{Conn: c, marker: []byte(marker), pastDeadline: make(chan struct{})}
		sc.onMarker = func() {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				closeErr <- e.h.Close(ctx)
			}()
			select {
			case <-sc.pastDeadline:
			case <-time.After(10 * time.Second):
				t.Error("Close did not abort the batch under way")
			}
		}
		return sc
	}, "")
	p, _ := e.start("s", "p")
	c, _ := e.dial("s", "p", e.control)
	p.print(t, marker+"\n")
	assert.Equal(t, marker, read(t, c))
	assert.Equal(t, websocket.StatusGoingAway, closed(t, c).Code, "the close frame reached the peer")
	require.NoError(t, <-closeErr)
	p.exit(0)
}

// dialStatus is the HTTP status of an attach with token.
func dialStatus(t *testing.T, e *env, sid, pid, token string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(e.srv.URL, "http") + fmt.Sprintf("/v1/sessions/%s/managed-process/%s/ws", sid, pid)
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err == nil {
		c.Close(websocket.StatusNormalClosure, "")
	}
	require.NotNil(t, resp)
	return resp.StatusCode
}

// blockedWriting counts the relay's goroutines blocked writing frames to a
// socket.
func blockedWriting() int {
	buf := make([]byte, 8<<20)
	buf = buf[:goruntime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "relay.(*bridge).sendBatch") && strings.Contains(g, "(*pollDesc).waitWrite") {
			n++
		}
	}
	return n
}

// fillStdin sends more than a pipe holds to a process that never reads its
// stdin, leaving the relay's reader blocked in the write (the stdin timeout
// is far away).
func fillStdin(t *testing.T, c *websocket.Conn) {
	t.Helper()
	frame := strings.Repeat("x", 16<<10)
	for range 8 {
		require.NoError(t, send(t, c, frame))
	}
	time.Sleep(100 * time.Millisecond)
}

// TestRelayCredentials: each process's relay token opens that process only;
// the operator's control token opens all; failures are 401 before anything
// about the target is revealed.
func TestRelayCredentials(t *testing.T) {
	e := newEnv(t, "")
	_, tokA := e.start("s1", "a")
	_, tokB := e.start("s1", "b")
	_, tokOther := e.start("s2", "a")
	tests := []struct {
		name, sid, pid, token string
		want                  int
	}{
		{"own token", "s1", "a", tokA, http.StatusSwitchingProtocols},
		{"sibling's token", "s1", "a", tokB, http.StatusUnauthorized},
		{"same process id, other session", "s1", "a", tokOther, http.StatusUnauthorized},
		{"control token", "s2", "a", e.control, http.StatusSwitchingProtocols},
		{"no token", "s1", "a", "", http.StatusUnauthorized},
		{"own token, unknown process", "s1", "zz", tokA, http.StatusUnauthorized},
		{"control token, unknown process", "s1", "zz", e.control, http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, dialStatus(t, e, tc.sid, tc.pid, tc.token))
		})
	}
}
