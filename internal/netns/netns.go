package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// The main thread never enters a sandbox's namespace: /proc/self (and
// /proc/net) show the main thread's, and Go cannot retire it, so a Do
// that ended there unable to go back would wedge it in the sandbox's
// namespace for good. Locked to the main goroutine from init, it never
// runs Do's goroutines.
func init() { runtime.LockOSThread() }

// Do runs f on a thread that has entered the network namespace ns; sockets
// f makes belong to ns for their whole life. The thread goes back to its
// own namespace afterwards, also when f ends its goroutine instead of
// returning (a test's t.Fatal: runtime.Goexit), which Do reports as an
// error; if it cannot go back, it stays locked and ends with its
// goroutine, so no other goroutine ever runs in the sandbox's namespace.
func Do(ns *os.File, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering the network namespace: %w", err)
			return
		}
		var ferr error
		returned := false
		defer func() {
			if !returned {
				ferr = errors.New("the function run in the network namespace did not return")
			}
			if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
				errc <- errors.Join(ferr, fmt.Errorf("leaving the network namespace: %w", err))
				return
			}
			runtime.UnlockOSThread()
			errc <- ferr
		}()
		ferr = f()
		returned = true
	}()
	return <-errc
}

// DialLoopback connects to 127.0.0.1:port inside the network namespace at
// path (a /proc/<pid>/ns/net). alive, checked once the namespace is open,
// reports whether pid was still the process meant (not a reused pid).
func DialLoopback(ctx context.Context, path string, alive func() bool, port int) (net.Conn, error) {
	ns, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening the sandbox's network namespace: %w", err)
	}
	defer ns.Close()
	if !alive() {
		return nil, ErrGone
	}
	var c net.Conn
	err = Do(ns, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		return err
	})
	return c, err
}

// ErrGone: the sandbox ended while its namespace was being opened.
var ErrGone = errors.New("the sandbox ended")
