package bwrap

import (
	"io"
	"os"
	"sync"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// veof is the terminal's end-of-file character (^D in the default line
// discipline): how "close stdin" reaches a command on a terminal, whose
// input never ends otherwise.
const veof = 0x04

// drainGrace is how long output is still waited for after the command
// exited: what it wrote is in the pipe by then and is read however slowly
// the caller takes it (sandboxagent.DrainReader), but a process it left in
// the background may hold the pipe (or terminal) open for good.
const drainGrace = 100 * time.Millisecond

// execIO is the plumbing of one exec's standard streams, made by boxrt
// and handed to the agent (only the command's ends enter the sandbox):
// output pipes copied to the request's writers, a stdin pipe fed from
// ExecRequest.Stdin, or a pseudo-terminal whose slave is all three streams
// of the command and whose master boxrt reads and writes.
type execIO struct {
	req            backends.ExecRequest
	stdin          *os.File // the command's ends (nil: /dev/null)
	stdout, stderr *os.File
	outR, errR     *os.File // our ends of the output pipes
	feed           *os.File // our end of the stdin pipe
	master         *os.File // pty master (TTY only)
	wg             sync.WaitGroup
}

// newExecIO makes req's streams; a terminal comes from openPTY (the
// sandbox's own devpts: machine.openPTY).
func newExecIO(req backends.ExecRequest, openPTY func() (master, slave *os.File, err error)) (_ *execIO, err error) {
	x := &execIO{req: req}
	defer func() {
		if err != nil {
			x.closeAll()
		}
	}()
	if req.TTY != nil {
		master, slave, err := openPTY()
		if err != nil {
			return nil, boxerr.Failure("bwrap: cannot open a pseudo-terminal: %v", err).Wrap(err)
		}
		x.master, x.stdin = master, slave
		if err := pty.Setsize(master, winsize(*req.TTY)); err != nil {
			return nil, boxerr.Failure("bwrap: cannot size the pseudo-terminal: %v", err).Wrap(err)
		}
		return x, nil
	}
	if req.Stdin != nil {
		if x.feed, x.stdin, err = childPipe(true); err != nil {
			return nil, err
		}
	}
	if req.Stdout != nil {
		if x.outR, x.stdout, err = childPipe(false); err != nil {
			return nil, err
		}
	}
	if req.Stderr != nil {
		if x.errR, x.stderr, err = childPipe(false); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// childPipe makes a pipe between boxrt (ours: non-blocking, in the
// runtime's poller, so deadlines work) and a command (child: the end it
// reads when childReads, else writes; blocking, as a child's stdio must
// be). os.Pipe would register both ends with the poller and the child's
// would be taken out again when it is passed: several system calls per
// pipe, three pipes an exec.
func childPipe(childReads bool) (ours, child *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, boxerr.Failure("bwrap: pipe: %v", err).Wrap(err)
	}
	o, c := p[0], p[1]
	if childReads {
		o, c = p[1], p[0]
	}
	if err := unix.SetNonblock(o, true); err != nil {
		unix.Close(o)
		unix.Close(c)
		return nil, nil, boxerr.Failure("bwrap: pipe: %v", err).Wrap(err)
	}
	return os.NewFile(uintptr(o), "|ours"), os.NewFile(uintptr(c), "|child"), nil
}

// spawnRequest is argv in lay's working directory and environment with
// these streams.
func (x *execIO) spawnRequest(argv []string, lay layout) sandboxagent.SpawnRequest {
	return sandboxagent.SpawnRequest{
		Argv: argv, Env: sandboxEnv(lay.env), Dir: lay.workdir, TTY: x.master != nil,
		Stdin: x.stdin, Stdout: x.stdout, Stderr: x.stderr,
	}
}

// started closes the command's ends (the sandbox holds its own copies, and
// ours would keep EOF from coming) and starts copying.
func (x *execIO) started() {
	for _, f := range []*os.File{x.stdin, x.stdout, x.stderr} {
		if f != nil {
			f.Close()
		}
	}
	x.stdin, x.stdout, x.stderr = nil, nil, nil
	x.copyOut(x.outR, x.req.Stdout)
	x.copyOut(x.errR, x.req.Stderr)
	// A terminal's output ends with EIO once every holder of the slave is
	// gone.
	x.copyOut(x.master, x.req.Stdout)
	switch {
	case x.master != nil && x.req.Stdin != nil:
		x.wg.Add(1)
		go func() {
			defer x.wg.Done()
			if _, err := io.Copy(x.master, x.req.Stdin); err == nil {
				_, _ = x.master.Write([]byte{veof})
			}
		}()
	case x.feed != nil:
		x.wg.Add(1)
		go func() {
			defer x.wg.Done()
			_, _ = io.Copy(x.feed, x.req.Stdin)
			x.feed.Close()
		}()
	}
}

func (x *execIO) copyOut(r *os.File, w io.Writer) {
	if r == nil {
		return
	}
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		_, _ = io.Copy(orDiscard(w), &sandboxagent.DrainReader{F: r})
	}()
}

// ended bounds the copies once the command has exited: output is waited
// for within drainGrace and what is buffered then is still taken, a stdin
// nobody reads any more is given up.
func (x *execIO) ended() {
	deadline := time.Now().Add(drainGrace)
	for _, f := range []*os.File{x.outR, x.errR, x.master} {
		if f != nil {
			_ = f.SetReadDeadline(deadline)
		}
	}
	for _, f := range []*os.File{x.feed, x.master} {
		if f != nil {
			_ = f.SetWriteDeadline(deadline)
		}
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
// pending read of the caller's stdin, waits for the copies (bounded by
// ended) and closes what is left.
func (x *execIO) finish() {
	if x.req.Stdin != nil {
		x.req.Stdin.Close()
	}
	x.ended()
	x.wg.Wait()
	x.closeAll()
}

func (x *execIO) closeAll() {
	for _, f := range []*os.File{x.stdin, x.stdout, x.stderr, x.outR, x.errR, x.feed, x.master} {
		if f != nil {
			f.Close()
		}
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
