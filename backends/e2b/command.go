package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process"
)

// Bounds of a command's stream (variables so that tests of a hostile
// envd need not wait minutes).
var (
	// streamIdle is how long a command's stream may say nothing (no
	// output, no keepalive: envd sends one well within it) before boxrt
	// takes the sandbox for lost.
	streamIdle = 3 * time.Minute
	// killWait is how long a killed command gets to report its end.
	killWait = 15 * time.Second
)

const (
	// inputChunk is the largest stdin write sent in one call.
	inputChunk = 64 << 10
	// maxPID is the largest pid a command may have (Linux's pid_max
	// limit).
	maxPID = 1 << 22
)

// command is one process started through envd's process.Start stream:
// the stream is read by one goroutine until the command's end event,
// the stream's end, or cancel.
type command struct {
	sb     *sandbox
	pid    uint32
	cancel context.CancelFunc
	idle   atomic.Bool // the stream went quiet past streamIdle
	done   chan struct{}
	// Valid once done is closed.
	end *process.ProcessEvent_EndEvent
	err error
}

// outputs are where a command's output goes (a terminal's to stdout).
type outputs struct{ stdout, stderr io.Writer }

// startRequest is envd's StartRequest for a command line run by sh.
func startRequest(cmd, workdir string, env map[string]string, tty *backends.TTYSize, stdin bool) *process.StartRequest {
	cfg := &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}, Envs: env}
	if workdir != "" {
		cfg.Cwd = &workdir
	}
	req := &process.StartRequest{Process: cfg, Stdin: &stdin}
	if tty != nil {
		req.Pty = &process.PTY{Size: &process.PTY_Size{Rows: uint32(tty.Rows), Cols: uint32(tty.Cols)}}
	}
	return req
}

// start starts req in sb and waits for its start event. limit, when
// positive, is sent as the stream's deadline, so the endpoint ends the
// command even if boxrt cannot.
func (b *Backend) start(ctx context.Context, sb *sandbox, req *process.StartRequest, out outputs, limit time.Duration) (*command, error) {
	// The stream outlives ctx (a cancel is a SIGKILL, sent by the caller).
	sctx, cancel := context.WithoutCancel(ctx), context.CancelFunc(nil)
	if limit > 0 {
		sctx, cancel = context.WithTimeout(sctx, limit)
	} else {
		sctx, cancel = context.WithCancel(sctx)
	}
	c := &command{sb: sb, cancel: cancel, done: make(chan struct{})}
	watchdog := time.AfterFunc(streamIdle, func() { c.idle.Store(true); cancel() })
	stop := context.AfterFunc(ctx, cancel) // the caller gives up before the start
	stream, err := sb.proc.Start(sctx, connect.NewRequest(req))
	if err == nil {
		err = c.started(stream)
	}
	watchdog.Stop()
	gaveUp := !stop()
	if gaveUp && err == nil {
		// The caller gave up as the command started: it must not run on.
		_ = c.signal(ctx, syscall.SIGKILL)
	}
	if gaveUp || err != nil {
		cancel()
		if stream != nil {
			_ = stream.Close()
		}
		if gaveUp {
			return nil, ctx.Err()
		}
		return nil, c.streamError(err)
	}
	go c.read(stream, out)
	go b.keepAlive(c)
	return c, nil
}

// keepAlive extends the sandbox's E2B timeout while the command runs, so
// a command longer than the timeout does not lose its sandbox.
func (b *Backend) keepAlive(c *command) {
	t := time.NewTicker(b.timeout / 4)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			b.touch(context.Background(), c.sb)
		}
	}
}

// started reads the stream's first event, which must be the start.
func (c *command) started(stream *connect.ServerStreamForClient[process.StartResponse]) error {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return err
		}
		return errors.New("the command's stream ended before it started")
	}
	st := stream.Msg().GetEvent().GetStart()
	if st == nil {
		return fmt.Errorf("the first event of a command is not its start: %T", stream.Msg().GetEvent().GetEvent())
	}
	if st.GetPid() == 0 || st.GetPid() > maxPID {
		return fmt.Errorf("pid %d reported for a command", st.GetPid())
	}
	c.pid = st.GetPid()
	return nil
}

// streamError is a failure of the command's stream as a typed error.
func (c *command) streamError(err error) error {
	if c.idle.Load() {
		return boxerr.Failure("e2b backend: the sandbox's envd sent nothing for %s; the command is taken for lost", streamIdle).Wrap(errGone)
	}
	return envdError("cmd", "", err)
}

// read delivers the command's output until its end event.
func (c *command) read(stream *connect.ServerStreamForClient[process.StartResponse], out outputs) {
	defer close(c.done)
	defer c.cancel()
	defer stream.Close()
	watchdog := time.AfterFunc(streamIdle, func() { c.idle.Store(true); c.cancel() })
	defer watchdog.Stop()
	for {
		watchdog.Reset(streamIdle)
		ok := stream.Receive()
		watchdog.Stop()
		if !ok {
			break
		}
		switch ev := stream.Msg().GetEvent().GetEvent().(type) {
		case *process.ProcessEvent_Data:
			write(out, ev.Data)
		case *process.ProcessEvent_End:
			c.end = ev.End
			return
		case *process.ProcessEvent_Start:
			c.err = boxerr.Failure("e2b backend: envd started command %d twice", c.pid)
			return
		}
	}
	if err := stream.Err(); err != nil {
		c.err = c.streamError(err)
		return
	}
	c.err = boxerr.Failure("e2b backend: envd ended command %d's stream without its end", c.pid).Wrap(errGone)
}

// write hands one data event to its writer; a writer that fails (its
// reader went away) loses the rest, the stream is still read to its end.
func write(out outputs, d *process.ProcessEvent_DataEvent) {
	var w io.Writer
	var p []byte
	switch v := d.GetOutput().(type) {
	case *process.ProcessEvent_DataEvent_Stdout:
		w, p = out.stdout, v.Stdout
	case *process.ProcessEvent_DataEvent_Stderr:
		w, p = out.stderr, v.Stderr
	case *process.ProcessEvent_DataEvent_Pty:
		w, p = out.stdout, v.Pty
	}
	if w != nil && len(p) > 0 {
		_, _ = w.Write(p)
	}
}

func (c *command) selector() *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: c.pid}}
}

// signal sends sig to the command. envd knows SIGKILL and SIGTERM only:
// other signals are sent as SIGTERM, the nearest that ends a command.
func (c *command) signal(ctx context.Context, sig syscall.Signal) error {
	s := process.Signal_SIGNAL_SIGTERM
	if sig == syscall.SIGKILL {
		s = process.Signal_SIGNAL_SIGKILL
	}
	ctx, cancel := unary(context.WithoutCancel(ctx))
	defer cancel()
	_, err := c.sb.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: c.selector(), Signal: s}))
	return envdError("signal", "", err)
}

// kill kills the command and waits (bounded) for its end; the stream is
// given up after that.
func (c *command) kill(ctx context.Context) {
	_ = c.signal(ctx, syscall.SIGKILL)
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		c.cancel()
		<-c.done
	}
}

// input writes p to the command's stdin (or terminal) in bounded calls.
func (c *command) input(ctx context.Context, p []byte, tty bool) error {
	for len(p) > 0 {
		n := min(len(p), inputChunk)
		in := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: p[:n]}}
		if tty {
			in.Input = &process.ProcessInput_Pty{Pty: p[:n]}
		}
		uctx, cancel := unary(ctx)
		_, err := c.sb.proc.SendInput(uctx, connect.NewRequest(&process.SendInputRequest{Process: c.selector(), Input: in}))
		cancel()
		if err != nil {
			return envdError("stdin", "", err)
		}
		p = p[n:]
	}
	return nil
}

func (c *command) closeStdin(ctx context.Context) error {
	ctx, cancel := unary(ctx)
	defer cancel()
	_, err := c.sb.proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: c.selector()}))
	return envdError("stdin", "", err)
}

func (c *command) resize(ctx context.Context, size backends.TTYSize) error {
	ctx, cancel := unary(ctx)
	defer cancel()
	_, err := c.sb.proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: c.selector(),
		Pty: &process.PTY{Size: &process.PTY_Size{Rows: uint32(size.Rows), Cols: uint32(size.Cols)}}}))
	return envdError("size", "", err)
}

// signalNames are how envd (Go's os.ProcessState) words a death by
// signal in an end event's status.
var signalNames = map[string]int{"hangup": 1, "interrupt": 2, "quit": 3, "killed": 9, "terminated": 15,
	"user defined signal 1": 10, "user defined signal 2": 12, "broken pipe": 13, "alarm clock": 14}

// exit is how the command ended: its exit code, or the signal that
// killed it (code 128+signal). An end that says neither is an error.
func (c *command) exit() (code, signal int, err error) {
	if c.err != nil {
		return 0, 0, c.err
	}
	e := c.end
	if e.GetExited() {
		if e.GetExitCode() < 0 || e.GetExitCode() > 255 {
			return 0, 0, boxerr.Failure("e2b backend: envd reported exit code %d for command %d", e.GetExitCode(), c.pid)
		}
		return int(e.GetExitCode()), 0, nil
	}
	if name, ok := strings.CutPrefix(e.GetStatus(), "signal: "); ok {
		if sig, ok := signalNames[name]; ok {
			return 128 + sig, sig, nil
		}
	}
	// boxrt's envd reports a runtime exit code with exited.
	return 0, 0, boxerr.Failure("e2b backend: command %d ended without an exit code: %s %s", c.pid, quote(e.GetStatus()), quote(e.GetError()))
}
