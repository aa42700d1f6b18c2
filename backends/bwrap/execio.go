package bwrap

import (
	"io"
	"os"
	"sync"

	"github.com/creack/pty"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// veof is the terminal's end-of-file character (^D in the default line
// discipline): how "close stdin" reaches a command on a terminal, whose
// input never ends otherwise.
const veof = 0x04

// execIO is the plumbing of one exec's standard streams beyond plain
// output writers: a stdin pipe fed from ExecRequest.Stdin, or a
// pseudo-terminal whose slave is all three streams of the command and
// whose master boxrt reads and writes.
type execIO struct {
	req    backends.ExecRequest
	stdin  *os.File  // the command's end (nil: /dev/null)
	stdout io.Writer // what the sandbox writes to
	stderr io.Writer
	feed   *os.File // our end of the stdin pipe
	master *os.File // pty master (TTY only)
	wg     sync.WaitGroup
}

func newExecIO(req backends.ExecRequest) (*execIO, error) {
	x := &execIO{req: req, stdout: req.Stdout, stderr: req.Stderr}
	switch {
	case req.TTY != nil:
		master, slave, err := pty.Open()
		if err != nil {
			return nil, boxerr.Failure("bwrap: cannot open a pseudo-terminal: %v", err).Wrap(err)
		}
		if err := pty.Setsize(master, winsize(*req.TTY)); err != nil {
			master.Close()
			slave.Close()
			return nil, boxerr.Failure("bwrap: cannot size the pseudo-terminal: %v", err).Wrap(err)
		}
		x.master = master
		x.stdin, x.stdout, x.stderr = slave, slave, slave
	case req.Stdin != nil:
		rd, wr, err := os.Pipe()
		if err != nil {
			return nil, boxerr.Failure("bwrap: pipe: %v", err).Wrap(err)
		}
		x.stdin, x.feed = rd, wr
	}
	return x, nil
}

// started closes the command's ends (the sandbox holds its own copies, and
// ours would keep EOF from coming) and starts copying.
func (x *execIO) started() {
	if x.stdin != nil {
		x.stdin.Close()
	}
	switch {
	case x.master != nil:
		x.wg.Add(1)
		go func() {
			defer x.wg.Done()
			// Ends with EIO once every holder of the slave is gone, which
			// the sandbox's end guarantees.
			_, _ = io.Copy(orDiscard(x.req.Stdout), x.master)
		}()
		if x.req.Stdin != nil {
			x.wg.Add(1)
			go func() {
				defer x.wg.Done()
				if _, err := io.Copy(x.master, x.req.Stdin); err == nil {
					_, _ = x.master.Write([]byte{veof})
				}
			}()
		}
	case x.feed != nil:
		x.wg.Add(1)
		go func() {
			defer x.wg.Done()
			_, _ = io.Copy(x.feed, x.req.Stdin)
			x.feed.Close()
		}()
	}
}

func (x *execIO) resize(sz backends.TTYSize) error {
	if x.master == nil {
		return boxerr.Validation("pty", "the command has no terminal")
	}
	if err := pty.Setsize(x.master, winsize(sz)); err != nil {
		return boxerr.Failure("bwrap: resizing the terminal: %v", err).Wrap(err)
	}
	return nil
}

// finish runs once the command has ended (or never started): it ends a
// pending read of the caller's stdin, waits for the copies (the terminal's
// output is drained to the end) and closes what is left.
func (x *execIO) finish() {
	if x.req.Stdin != nil {
		x.req.Stdin.Close()
	}
	if x.stdin != nil {
		x.stdin.Close() // never started: the slave would keep the master open
	}
	x.wg.Wait()
	if x.master != nil {
		x.master.Close()
	}
	if x.feed != nil {
		x.feed.Close()
	}
}

func winsize(sz backends.TTYSize) *pty.Winsize {
	return &pty.Winsize{Rows: sz.Rows, Cols: sz.Cols}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
