package sandboxagent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// bridgeDialTimeout bounds a bridge's wait for the agent's socket: right
// after a Pod got the agent's binary, the agent may not listen yet.
const bridgeDialTimeout = 15 * time.Second

// listen is the agent of a sandbox boxrt reaches only by running commands
// in it (a Pod's exec): it listens on path, and serves each "boxrt agent
// --bridge PATH" boxrt runs that connects to it, at once (two replicas of
// boxrt serving one session each have theirs). Each connection has its
// processes, as a dialling agent's connection has; they share the reaper.
// Anyone in the sandbox may connect, and so start processes: no more than
// the sandbox's code can do itself.
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
	a.mu.Lock()
	a.served = []*agent{}
	a.mu.Unlock()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			fmt.Fprintf(os.Stderr, "boxrt agent: accept: %v\n", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		conn := &agent{mu: a.mu, relays: a.relays, forked: a.forked}
		a.mu.Lock()
		a.served = append(a.served, conn)
		a.mu.Unlock()
		go func() {
			err := conn.serve(newFrameConn(c, true))
			fmt.Fprintf(os.Stderr, "boxrt agent: connection ended: %v\n", err)
			a.mu.Lock()
			a.served = slices.DeleteFunc(a.served, func(x *agent) bool { return x == conn })
			a.mu.Unlock()
		}()
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
