package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// userEnv is a new user's machine, as the README and --help address
// them: a home with boxrt's default state directory in it, a working
// directory with bin/boxrt, and boxrt on the PATH. Its runtime runs in a
// network namespace of its own, where 127.0.0.1:5410, the default
// address the docs use, is free whatever else runs on this machine.
type userEnv struct {
	dir   string // the working directory, holding bin/boxrt
	home  string
	state string // the default state directory under home
	env   []string
	pid   int // the runtime, whose network namespace the commands join
}

// newUserEnv prepares the directories and environment for backend (a
// backendConfigs key); the runtime is started with serve.
func newUserEnv(t *testing.T, backend string) *userEnv {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare is not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("a network namespace of its own needs root")
	}
	u := &userEnv{dir: t.TempDir(), home: t.TempDir()}
	u.state = filepath.Join(u.home, ".local", "state", "boxrt")
	bin := filepath.Join(u.dir, "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	require.NoError(t, os.Symlink(binPath, filepath.Join(bin, "boxrt")))
	// Go's caches stay where they are: they default to places under HOME.
	goEnv, err := exec.Command("go", "env", "GOPATH", "GOMODCACHE", "GOCACHE").Output()
	require.NoError(t, err)
	vals := strings.Split(strings.TrimSpace(string(goEnv)), "\n")
	require.Len(t, vals, 3)
	// As root DefaultStateDir is /var/lib/boxrt: BOXRT_STATE_DIR names
	// the non-root default the README's token line reads.
	u.env = append(os.Environ(), "GOPATH="+vals[0], "GOMODCACHE="+vals[1], "GOCACHE="+vals[2], "HOME="+u.home, "BOXRT_STATE_DIR="+u.state, "XDG_STATE_HOME=",
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "BOXRT_CONTROL_TOKEN=", "LANGBOT_BOX_CONTROL_TOKEN=",
		"BOXRT_CONFIG={"+backendConfigs[backend]+"}")
	return u
}

// serve starts the runtime with the shell command line, in a new network
// namespace, waits until it serves and returns its stderr.
func (u *userEnv) serve(t *testing.T, line string) *syncBuffer {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "bash", "-c", "ip link set lo up && exec "+line)
	cmd.Dir, cmd.Env = u.dir, u.env
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("runtime's stderr:\n%s", lastLines(stderr.String(), 40))
		}
	})
	u.pid = cmd.Process.Pid
	deadline := time.After(3 * time.Minute)
	for !strings.Contains(stderr.String(), "boxrt serving") {
		select {
		case <-exited:
			t.Fatalf("%q exited: %s", line, stderr.String())
		case <-deadline:
			t.Fatalf("%q is not serving after 3 minutes: %s", line, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return stderr
}

// run runs a shell command line in the working directory, in the
// runtime's network namespace (or a new one before serve), and returns
// its stdout, stderr and exit status.
func (u *userEnv) run(t *testing.T, line string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{"--net", "bash", "-c", "ip link set lo up && " + line}
	name := "unshare"
	if u.pid != 0 {
		name, args = "nsenter", []string{fmt.Sprintf("--net=/proc/%d/ns/net", u.pid), "--", "bash", "-c", line}
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = u.dir, u.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return stdout.String(), stderr.String(), ee.ExitCode()
	}
	require.NoError(t, err, "%s: %s", line, stderr.String())
	return stdout.String(), stderr.String(), 0
}

// dialWS opens rawURL's WebSocket from inside the runtime's network
// namespace with the header line ("Name: value").
func (u *userEnv) dialWS(t *testing.T, rawURL, header string) *WS {
	t.Helper()
	name, value, ok := strings.Cut(header, ": ")
	require.True(t, ok, "header %q", header)
	h := http.Header{}
	h.Set(name, value)
	parsed, err := url.Parse(rawURL)
	require.NoError(t, err)
	conn := u.dialTCP(t, parsed.Host)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, rawURL, &websocket.DialOptions{HTTPHeader: h, HTTPClient: hc})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	require.NoError(t, err)
	t.Cleanup(func() { c.CloseNow() })
	return &WS{t: t, C: c}
}

// dialTCP connects to addr from the runtime's network namespace, on a
// thread that joins it and then goes back: the socket stays in the
// namespace it was made in. A thread that cannot go back stays locked, so
// Go retires it (the main thread would be wedged in the namespace, and
// /proc/self/net with it).
func (u *userEnv) dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	type dialed struct {
		conn net.Conn
		err  error
	}
	ch := make(chan dialed, 1)
	go func() {
		runtime.LockOSThread()
		conn, err := dialFromNetns(u.pid, addr)
		ch <- dialed{conn, err}
	}()
	d := <-ch
	require.NoError(t, d.err)
	return d.conn
}

// dialFromNetns dials addr from pid's network namespace on the locked
// calling thread, and unlocks it once it is back in its own.
func dialFromNetns(pid int, addr string) (net.Conn, error) {
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	defer own.Close()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, err
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread()
	}
	return conn, err
}
