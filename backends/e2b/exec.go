package e2b

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// streamGrace is how much longer than the command's own timeout its
// stream's deadline is: boxrt kills the command at the timeout; the
// endpoint ends it at the stream's deadline should boxrt not.
const streamGrace = 30 * time.Second

// Exec implements backends.Backend: the command runs under sh in the
// sandbox through envd's Start stream, its output written as it comes;
// at the timeout or on cancel boxrt sends SIGKILL. The live fields are
// served through envd (stdin: SendInput/CloseStdin; terminal: a pty and
// Update; signals: SendSignal).
func (b *Backend) Exec(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	defer closeInput(req.Stdin)
	sb, err := b.envd(ctx, info)
	if err != nil {
		return backends.ExitStatus{}, err
	}
	limit := time.Duration(0)
	if req.Timeout > 0 {
		limit = req.Timeout + streamGrace
	}
	sreq := startRequest(req.Cmd, req.Workdir, req.Env, req.TTY, req.Stdin != nil || req.TTY != nil)
	c, err := b.start(ctx, sb, sreq, outputs{stdout: req.Stdout, stderr: req.Stderr}, limit)
	if err != nil {
		return backends.ExitStatus{}, err
	}
	fed := make(chan struct{})
	fctx, stopFeed := context.WithCancel(ctx)
	if req.Stdin != nil {
		go func() {
			defer close(fed)
			feed(fctx, c, req.Stdin, req.TTY != nil)
		}()
	} else {
		close(fed)
	}
	st, err := b.follow(ctx, c, req)
	stopFeed()
	closeInput(req.Stdin) // ends a Read the feeder still waits in
	<-fed
	return st, err
}

func closeInput(in io.ReadCloser) {
	if in != nil {
		_ = in.Close()
	}
}

// follow serves a running command's live fields until it ends, times out
// or ctx ends.
func (b *Backend) follow(ctx context.Context, c *command, req backends.ExecRequest) (backends.ExitStatus, error) {
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case <-c.done:
			code, _, err := c.exit()
			return backends.ExitStatus{ExitCode: code}, err
		case <-timeout:
			c.kill(ctx)
			return backends.ExitStatus{TimedOut: true}, nil
		case <-ctx.Done():
			c.kill(ctx)
			return backends.ExitStatus{}, ctx.Err()
		case sig := <-req.Signals:
			_ = c.signal(ctx, sig)
		case rs := <-req.Resize:
			rs.Done <- c.resize(ctx, rs.Size)
		}
	}
}

// feed copies the command's stdin to it, then closes it (a terminal's
// stays open: its EOF is a ^D the caller types). It ends when in does.
func feed(ctx context.Context, c *command, in io.Reader, tty bool) {
	buf := make([]byte, inputChunk)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if c.input(ctx, buf[:n], tty) != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			if !tty {
				_ = c.closeStdin(ctx)
			}
			return
		}
		if err != nil {
			return
		}
	}
}
