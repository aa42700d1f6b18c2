package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "boxrt-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "boxrt")
	build := exec.Command("go", "build", "-race", "-o", binPath, "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building boxrt failed:", err)
		os.Exit(1)
	}
	// The race build links libc; the sessions' agent must run in any
	// image, so it is a static build of the same code.
	agent := filepath.Join(dir, "boxrt-agent")
	build = exec.Command("go", "build", "-o", agent, "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the static agent failed:", err)
		os.Exit(1)
	}
	os.Setenv("BOXRT_AGENT_BINARY", agent)
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Response is a JSON-RPC response as read off the wire.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *WireError      `json:"error"`
}

// WireError is a JSON-RPC error object.
type WireError struct {
	Code    int64          `json:"code"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data"`
}

func (e *WireError) Type() string {
	t, _ := e.Data["type"].(string)
	return t
}

// Proc is a running boxrt.
type Proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *os.File // the host's end of boxrt's stdout
	lines  chan []byte
	stderr *syncBuffer
	Addr   string // HTTP listener, host:port
	State  string
	// Token is the control token boxrt generated in its state directory
	// (WebSocket mode without a configured token); "" otherwise.
	Token   string
	http    *http.Client
	done    chan struct{}
	mu      sync.Mutex
	nextID  int
	waiters map[string]chan Response
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Options for starting boxrt.
type Options struct {
	// Command is the boxrt command run, with serve's flags; serve when "".
	Command  string
	Args     []string // extra serve flags
	Env      []string
	StateDir string
	Stdio    bool
	Config   string // JSON, passed as BOXRT_CONFIG
	Addr     string // listen address; a free loopback port when empty
	Dir      string // working directory; the test's when empty
	// ExtraFiles are inherited by boxrt from fd 3 on, as exec.Cmd's are.
	ExtraFiles []*os.File
	// HTTP reaches boxrt's listener (default: http.DefaultClient); one
	// started in another network namespace needs a client that dials
	// there.
	HTTP *http.Client
}

// freeAddr returns a loopback address with a free port.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// Start spawns boxrt serve. In stdio mode responses are read from stdout;
// in both modes the HTTP listener is on p.Addr.
func Start(t *testing.T, o Options) *Proc {
	t.Helper()
	if o.StateDir == "" {
		o.StateDir = t.TempDir()
	}
	addr := o.Addr
	if addr == "" {
		addr = freeAddr(t)
	}
	command := o.Command
	if command == "" {
		command = "serve"
	}
	args := append([]string{command, "--listen", addr, "--state-dir", o.StateDir, "--log-level", "debug"}, o.Args...)
	if o.Stdio {
		args = append(args, "--stdio")
	}
	cmd := exec.Command(binPath, args...)
	cmd.Dir = o.Dir
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.ExtraFiles = o.ExtraFiles
	if o.Config != "" {
		cmd.Env = append(cmd.Env, "BOXRT_CONFIG="+o.Config)
	}
	// Runs after the Stop below (cleanups run last-registered first).
	t.Cleanup(func() { reapSandboxes(t, o.StateDir) })
	if o.HTTP == nil {
		o.HTTP = http.DefaultClient
	}
	p := &Proc{t: t, cmd: cmd, http: o.HTTP, stderr: &syncBuffer{}, Addr: addr, State: o.StateDir, done: make(chan struct{}),
		waiters: map[string]chan Response{}, lines: make(chan []byte, 1024)}
	cmd.Stderr = p.stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	p.stdin = stdin
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p.stdout, _ = stdout.(*os.File)
	require.NoError(t, cmd.Start())
	go p.readStdout(stdout)
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("boxrt stderr:\n%s", lastLines(p.stderr.String(), 60))
		}
	})
	p.waitHTTP()
	if !o.Stdio {
		if b, err := os.ReadFile(filepath.Join(o.StateDir, "control-token")); err == nil {
			p.Token = strings.TrimSpace(string(b))
		}
	}
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (p *Proc) waitHTTP() {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := p.http.Get("http://" + p.Addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			return
		}
		select {
		case <-p.done:
			p.t.Fatalf("boxrt exited early: %s", p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	p.t.Fatalf("boxrt did not listen on %s: %s", p.Addr, p.stderr.String())
}

func (p *Proc) readStdout(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := append([]byte(nil), sc.Bytes()...)
		var resp Response
		if err := json.Unmarshal(line, &resp); err == nil && resp.ID != nil {
			p.mu.Lock()
			ch, ok := p.waiters[string(resp.ID)]
			delete(p.waiters, string(resp.ID))
			p.mu.Unlock()
			if ok {
				ch <- resp
				continue
			}
		}
		select {
		case p.lines <- line:
		default:
		}
	}
	close(p.lines)
}

// Send writes raw bytes to stdin.
func (p *Proc) Send(b []byte) {
	p.t.Helper()
	_, err := p.stdin.Write(b)
	require.NoError(p.t, err)
}

// NextLine returns the next stdout line that no Call waited for.
func (p *Proc) NextLine(timeout time.Duration) []byte {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		require.True(p.t, ok, "stdout closed")
		return l
	case <-time.After(timeout):
		p.t.Fatalf("no stdout line within %v", timeout)
	}
	return nil
}

// Call sends a request over stdio and waits for its response.
func (p *Proc) Call(method string, params any, timeout time.Duration) Response {
	p.t.Helper()
	return p.CallMeta(nil, method, params, timeout)
}

// CallMeta is Call with a tenant context in "meta" (none when nil).
func (p *Proc) CallMeta(meta any, method string, params any, timeout time.Duration) Response {
	p.t.Helper()
	p.mu.Lock()
	p.nextID++
	id := fmt.Sprintf("%d", p.nextID)
	ch := make(chan Response, 1)
	p.waiters[id] = ch
	p.mu.Unlock()
	msg := map[string]any{"jsonrpc": "2.0", "id": p.nextIDValue(id), "method": method, "params": params}
	if meta != nil {
		msg["meta"] = meta
	}
	req, err := json.Marshal(msg)
	require.NoError(p.t, err)
	p.Send(append(req, '\n'))
	select {
	case r := <-ch:
		return r
	case <-time.After(timeout):
		p.t.Fatalf("%s: no response within %v", method, timeout)
	}
	return Response{}
}

func (p *Proc) nextIDValue(id string) json.RawMessage { return json.RawMessage(id) }

// MustCall is Call that requires success and decodes the result.
func (p *Proc) MustCall(method string, params any, result any) {
	p.t.Helper()
	r := p.Call(method, params, 2*time.Minute)
	require.Nil(p.t, r.Error, "%s failed: %+v", method, r.Error)
	if result != nil {
		require.NoError(p.t, json.Unmarshal(r.Result, result))
	}
}

// CloseStdin sends EOF.
func (p *Proc) CloseStdin() { _ = p.stdin.Close() }

// Wait waits for exit and returns the exit code.
func (p *Proc) Wait(timeout time.Duration) (int, bool) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return -1, false
	}
}

// Kill sends SIGKILL and waits.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop ends boxrt gracefully (stdin EOF, then SIGTERM, then SIGKILL).
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.CloseStdin()
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.Kill()
	}
}

// Stderr returns what boxrt logged.
func (p *Proc) Stderr() string { return p.stderr.String() }

// WS is a JSON-RPC client over /rpc/ws.
type WS struct {
	t    *testing.T
	C    *websocket.Conn
	next int
}

// DialWS connects to /rpc/ws with the token (may be "").
func DialWS(t *testing.T, addr, token string) *WS {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+addr+"/rpc/ws", &websocket.DialOptions{HTTPHeader: h})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	require.NoError(t, err)
	c.SetReadLimit(64 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return &WS{t: t, C: c}
}

// Call sends one request and reads frames until its response arrives.
func (w *WS) Call(method string, params any) Response {
	w.t.Helper()
	w.next++
	req, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": w.next, "method": method, "params": params})
	require.NoError(w.t, err)
	w.Send(req)
	for {
		r := w.Read(2 * time.Minute)
		if string(r.ID) == fmt.Sprint(w.next) {
			return r
		}
	}
}

// Send writes one text frame.
func (w *WS) Send(b []byte) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(w.t, w.C.Write(ctx, websocket.MessageText, b))
}

// Read reads one response frame.
func (w *WS) Read(timeout time.Duration) Response {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, data, err := w.C.Read(ctx)
	require.NoError(w.t, err)
	var r Response
	require.NoError(w.t, json.Unmarshal(data, &r), "frame: %s", data)
	return r
}

// reapSandboxes ends what the bwrap sessions of stateDir left running
// once its boxrt stopped: a persistent session's sandbox outlives boxrt by
// design, so a test that does not delete its sessions would leave
// processes and their stages' mounts behind. Every bwrap process of the
// state directory's instances is killed (found by its cgroup, which
// carries the instance id) and their stages are unmounted.
func reapSandboxes(t *testing.T, stateDir string) {
	instances, _ := os.ReadDir(filepath.Join(stateDir, "bwrap"))
	for _, inst := range instances {
		marker := "/boxrt/" + inst.Name() + "/"
		procs, _ := os.ReadDir("/proc")
		for _, e := range procs {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if b, err := os.ReadFile("/proc/" + e.Name() + "/cgroup"); err == nil && strings.Contains(string(b), marker) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		stage := filepath.Join("/run/boxrt/bwrap", inst.Name())
		for _, mp := range mountsBelow(stage) {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
				t.Logf("unmount %s: %v", mp, err)
			}
		}
		_ = os.RemoveAll(stage)
		removeCgroups(inst.Name())
	}
}

// removeCgroups removes instance's cgroups (cgroup v1 hierarchies and v2)
// once reapSandboxes has killed what was in them: a persistent session's,
// kept for a next boxrt on a state directory the test deletes, would stay
// for good. Its killed tasks may take a moment to go (EBUSY).
func removeCgroups(instance string) {
	v1, _ := filepath.Glob("/sys/fs/cgroup/*/boxrt/" + instance)
	v2, _ := filepath.Glob("/sys/fs/cgroup/boxrt/" + instance)
	deadline := time.Now().Add(3 * time.Second)
	for _, d := range append(v1, v2...) {
		rmdirCgroupTree(d, deadline)
	}
}

// rmdirCgroupTree removes the cgroup d and the cgroups below it, deepest
// first.
func rmdirCgroupTree(d string, deadline time.Time) {
	entries, _ := os.ReadDir(d)
	for _, e := range entries {
		if e.IsDir() {
			rmdirCgroupTree(filepath.Join(d, e.Name()), deadline)
		}
	}
	for syscall.Rmdir(d) == syscall.EBUSY && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// mountsBelow lists the mount points at or below dir, deepest first.
func mountsBelow(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}
