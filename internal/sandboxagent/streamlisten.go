package sandboxagent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// bridgeDialTimeout bounds a bridge's wait for the agent's socket: right
// after a Pod got the agent's binary, the agent may not listen yet.
const bridgeDialTimeout = 15 * time.Second

// listen is the agent of a sandbox boxrt reaches only by running commands
// in it (a Pod's exec): it listens on path, and each "boxrt agent --bridge
// PATH" boxrt runs connects to it. The newest connection is served: one
// that comes replaces the one before (a broken exec stream may leave a
// bridge that is not yet gone). Anyone in the sandbox may connect, and so
// start processes: no more than the sandbox's code can do itself.
func (a *agent) listen(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return err
	}
	var current *net.UnixConn
	done := make(chan struct{})
	close(done)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			fmt.Fprintf(os.Stderr, "boxrt agent: accept: %v\n", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if current != nil {
			current.Close()
		}
		<-done
		current, done = c, make(chan struct{})
		go func(c *net.UnixConn, done chan struct{}) {
			defer close(done)
			err := a.serve(newFrameConn(c, true))
			fmt.Fprintf(os.Stderr, "boxrt agent: connection ended: %v\n", err)
		}(c, done)
	}
}

// bridge joins its stdin and stdout (an exec's stream) to the agent's
// socket at path, until either ends. It waits for the socket to appear.
func bridge(path string) error {
	deadline := time.Now().Add(bridgeDialTimeout)
	c, err := dial(path)
	for err != nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		c, err = dial(path)
	}
	if err != nil {
		return fmt.Errorf("the agent is not listening: %w", err)
	}
	defer c.Close()
	go func() {
		io.Copy(c, os.Stdin)
		c.CloseWrite()
	}()
	_, err = io.Copy(os.Stdout, c)
	if errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET) {
		err = nil
	}
	return err
}
