package netns

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// listenerInNetns starts, in a network namespace of its own, a python3
// server on 127.0.0.1 that writes "hi" to each connection; it returns the
// server's pid once it listens.
func listenerInNetns(t *testing.T) (pid, port int) {
	t.Helper()
	script := `import socket, sys, os
os.system("ip link set lo up")
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"hi"); c.close()`
	cmd := exec.Command("unshare", "--net", "python3", "-c", script)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	port, err = strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	return cmd.Process.Pid, port
}

func TestDialLoopback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("entering another network namespace needs root")
	}
	pid, port := listenerInNetns(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path := "/proc/" + strconv.Itoa(pid) + "/ns/net"
	c, err := DialLoopback(ctx, path, func() bool { return true }, port)
	require.NoError(t, err)
	got, err := io.ReadAll(c)
	c.Close()
	require.NoError(t, err)
	assert.Equal(t, "hi", string(got), "the connection reached the namespace's loopback")

	// From boxrt's own namespace the port is not there.
	c, err = DialLoopback(ctx, "/proc/self/ns/net", func() bool { return true }, port)
	if err == nil {
		got, _ := io.ReadAll(c)
		c.Close()
		assert.NotEqual(t, "hi", string(got))
	}

	_, err = DialLoopback(ctx, path, func() bool { return false }, port)
	assert.ErrorIs(t, err, ErrGone)
	_, err = DialLoopback(ctx, "/proc/0/ns/net", func() bool { return true }, port)
	assert.Error(t, err)
}

// TestDoLeavesTheNamespace: after Do, new sockets of the calling
// goroutine's threads are in boxrt's namespace again.
func TestDoLeavesTheNamespace(t *testing.T) {
	pid, _ := listenerInNetns(t)
	ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	require.NoError(t, err)
	defer ns.Close()
	own, err := os.Readlink("/proc/thread-self/ns/net")
	require.NoError(t, err)
	var inside string
	require.NoError(t, Do(ns, func() (err error) {
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}))
	theirs, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
	require.NoError(t, err)
	assert.Equal(t, theirs, inside)
	assert.NotEqual(t, own, inside)
	for i := 0; i < 50; i++ { // whichever thread runs this goroutine now
		now, err := os.Readlink("/proc/thread-self/ns/net")
		require.NoError(t, err)
		require.Equal(t, own, now)
	}
}

// TestDoReportsGoexit: a function that ends its goroutine (a test's
// t.Fatal) is an error, not a wait forever, and the thread goes home.
func TestDoReportsGoexit(t *testing.T) {
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := Do(ns, func() error { runtime.Goexit(); return nil }); err == nil {
		t.Fatal("Do returned nil for a function that did not return")
	}
	if err := Do(ns, func() error { return nil }); err != nil {
		t.Fatalf("the next Do: %v", err)
	}
}
