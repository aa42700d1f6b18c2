package docker

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// outputGrace is how long a command's output is still read after its
// process exited, for what a background process it left still holds (the
// Engine gives such a stream two seconds).
const outputGrace = time.Second

// agentExec runs req through the container's agent. What a command
// started in the background keeps running when it ends, live or plain (it
// is the session's); a timeout, a cancel or a kill end its whole process
// group. (Engine-exec wrappers, the fallback, still end a live exec's
// group with it.)
func (b *Backend) agentExec(ctx context.Context, info backends.Session, l *agentLink, req backends.ExecRequest) (backends.ExitStatus, error) {
	conn, env, restarted, err := l.get(ctx)
	if err != nil {
		return backends.ExitStatus{}, err
	}
	workdir, _ := execproc.Paths(info, req.Workdir, "exec", "")
	openTerminal := func() (*os.File, *os.File, error) { return l.openPTY(conn) }
	if b.OnGVisor(info.Sandbox) {
		openTerminal = nil // the agent's own terminal, relayed (agentIO)
	}
	sio, err := newAgentIO(req.TTY, req.Stdin != nil, openTerminal)
	if err != nil {
		return backends.ExitStatus{}, boxerr.Failure("docker backend: making the command's stdio: %v", err).Wrap(err)
	}
	defer sio.close()
	proc, err := conn.Spawn(ctx, sandboxagent.SpawnRequest{
		Argv:  sandboxsh.AgentExecArgv(workdir, req.Cmd, req.NoLogin),
		Env:   mergeEnv(env, req.Env),
		Dir:   "/",
		TTY:   req.TTY != nil && !sio.relayed,
		Term:  sio.term(req.TTY),
		Stdin: sio.childIn, Stdout: sio.childOut, Stderr: sio.childErr,
	})
	sio.closeChildEnds()
	if err != nil {
		return backends.ExitStatus{}, b.spawnError(ctx, l, conn, err)
	}
	oom := b.oomKills(conn.PeerPID())
	r := watchRun(proc, sio, req)
	defer r.stop()
	status, ended, err := execproc.Await(ctx, req, execproc.Running{
		Ended:  r.ended,
		Resize: func(size backends.TTYSize) error { return sio.resize(ctx, proc, size) },
		Signal: func(sig syscall.Signal) { _ = proc.Signal(sig) },
		Kill:   func() { restarted = r.kill(ctx, l, conn) || restarted },
	})
	status.Restarted = restarted
	status.OOMKilled = oom >= 0 && b.oomKills(conn.PeerPID()) > oom
	if !ended {
		return status, err
	}
	if werr := r.writeErr(); werr != nil {
		status.Restarted = r.kill(ctx, l, conn) || restarted
		return status, boxerr.Failure("writing command output: %v", werr).Wrap(werr)
	}
	<-r.exited
	if r.waitErr != nil {
		return b.lostExec(ctx, l, conn)
	}
	status.ExitCode = r.exit.Code
	return status, nil
}

// lostExec is the result of a command whose agent connection ended under
// it: lost's error, except for a gVisor sandbox the memory cgroup's OOM
// killer ended as a whole (the sentry holds all its memory, and the agent
// went with it): the command was killed for memory, as runc's OOM killer
// would have killed it, so it reads as 137, as on the Engine-exec path
// (sandboxDied), and the container is started again (files kept,
// processes gone: restarted).
func (b *Backend) lostExec(ctx context.Context, l *agentLink, conn *sandboxagent.Conn) (backends.ExitStatus, error) {
	if !b.OnGVisor(l.info.Sandbox) || !errors.Is(conn.Err(), sandboxagent.ErrAgentLost) || l.b.background.Err() != nil {
		return backends.ExitStatus{}, l.lost(ctx, conn)
	}
	b.waitNotRunning(ctx, l.info, killGrace)
	if st, err := b.sandboxDied(ctx, l.info); err != nil || st.ExitCode != 137 {
		return backends.ExitStatus{}, l.lost(ctx, conn)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == conn {
		if err := l.restart(ctx); err != nil {
			return backends.ExitStatus{}, err
		}
		l.restarted = false // this result says it
	}
	return backends.ExitStatus{ExitCode: 137, Restarted: true}, nil
}

// spawnError is the error of a Spawn: the agent's refusal as such, a lost
// or misbehaving agent as lost says.
func (b *Backend) spawnError(ctx context.Context, l *agentLink, conn *sandboxagent.Conn, err error) error {
	var refused *sandboxagent.SpawnError
	switch {
	case errors.As(err, &refused):
		return boxerr.Failure("docker backend: %v", refused).Wrap(err)
	case isContextErr(err):
		return err
	}
	select {
	case <-conn.Done():
		return l.lost(ctx, conn)
	default:
		return boxerr.Failure("docker backend: starting the command: %v", err).Wrap(err)
	}
}

// agentIO is a command's stdio: pipes, or a pseudo-terminal, made by boxrt
// so that output never passes through the agent; except under gVisor,
// whose kernel does not take a host terminal for a controlling terminal:
// there the agent makes the terminal in the sandbox and relays it to a
// stdin and an output pipe of boxrt's (relayed), which boxrt reads and
// bounds as any output.
type agentIO struct {
	childIn, childOut, childErr *os.File // the command's ends, closed once passed
	stdinW                      *os.File // boxrt's end of the command's stdin (no terminal of boxrt's)
	master                      *os.File // the terminal's master (a terminal of boxrt's)
	readers                     []*os.File
	tty                         bool
	relayed                     bool // the terminal is the agent's
}

// newAgentIO makes the stdio of a command with terminal tty (nil: none),
// opened by openTerminal (nil: the agent's, relayed), and, without one, a
// stdin pipe when withStdin (else /dev/null).
func newAgentIO(tty *backends.TTYSize, withStdin bool, openTerminal func() (master, slave *os.File, err error)) (s *agentIO, err error) {
	s = &agentIO{tty: tty != nil, relayed: tty != nil && openTerminal == nil}
	defer func() {
		if err != nil {
			s.closeChildEnds()
			s.close()
		}
	}()
	if s.tty && !s.relayed {
		if s.master, s.childIn, err = openTerminal(); err != nil {
			return s, err
		}
		if err = setWinsize(s.master, *tty); err != nil {
			return s, err
		}
		s.readers = []*os.File{s.master}
		return s, nil
	}
	// A relayed terminal's stdin pipe stays open until the command ended:
	// its end is the terminal's hangup.
	if withStdin || s.relayed {
		if s.childIn, s.stdinW, err = os.Pipe(); err != nil {
			return s, err
		}
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return s, err
	}
	s.readers, s.childOut = append(s.readers, outR), outW
	if s.relayed {
		return s, nil // the terminal's output is one stream
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return s, err
	}
	s.readers, s.childErr = append(s.readers, errR), errW
	return s, nil
}

// openPTY opens a terminal in the container's own devpts, so that inside
// it has a name (/dev/pts/N) and the host's terminals stay out of reach.
func (l *agentLink) openPTY(conn *sandboxagent.Conn) (master, slave *os.File, err error) {
	root, err := l.openRoot(conn)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(root)
	return sandboxagent.OpenPTY(root)
}

// setWinsize sizes the terminal without Fd (which would make the master
// blocking again).
func setWinsize(master *os.File, size backends.TTYSize) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols})
	})
	if err != nil {
		return err
	}
	return ioErr
}

// term is the size of the terminal the agent makes for the command, nil
// when it makes none.
func (s *agentIO) term(tty *backends.TTYSize) *sandboxagent.TermSize {
	if !s.relayed {
		return nil
	}
	return &sandboxagent.TermSize{Rows: tty.Rows, Cols: tty.Cols}
}

// resize takes effect before it returns: the terminal is boxrt's, or the
// agent says it sized its own.
func (s *agentIO) resize(ctx context.Context, proc *sandboxagent.Proc, size backends.TTYSize) error {
	switch {
	case s.relayed:
		if err := proc.Resize(ctx, sandboxagent.TermSize{Rows: size.Rows, Cols: size.Cols}); err != nil {
			return boxerr.Failure("docker backend: resizing the command's terminal: %v", err).Wrap(err)
		}
		return nil
	case s.master == nil:
		return boxerr.Validation("resize", "the command has no terminal")
	}
	return setWinsize(s.master, size)
}

func (s *agentIO) closeChildEnds() {
	for _, f := range []*os.File{s.childIn, s.childOut, s.childErr} {
		if f != nil {
			f.Close()
		}
	}
	s.childIn, s.childOut, s.childErr = nil, nil, nil
}

func (s *agentIO) close() {
	if s.stdinW != nil {
		s.stdinW.Close()
	}
	for _, f := range s.readers {
		f.Close()
	}
}

// agentRun follows a started command: its exit (through the agent), its
// output (copied from boxrt's ends) and its stdin.
type agentRun struct {
	proc    *sandboxagent.Proc
	sio     *agentIO
	exited  chan struct{}
	exit    sandboxagent.Exit // valid after exited
	waitErr error             // valid after exited
	// ended closes once the command exited and its output was read (to
	// EOF, or for outputGrace), or once writing its output failed.
	ended    chan struct{}
	copies   sync.WaitGroup
	failed   chan struct{}
	failOnce sync.Once
	writers  []*trackingWriter
	stdin    func() // ends the stdin copy
}

func watchRun(proc *sandboxagent.Proc, sio *agentIO, req backends.ExecRequest) *agentRun {
	r := &agentRun{proc: proc, sio: sio, exited: make(chan struct{}), ended: make(chan struct{}), failed: make(chan struct{})}
	go func() {
		r.exit, r.waitErr = proc.Wait(context.Background())
		close(r.exited)
	}()
	dests := []io.Writer{execproc.OrDiscard(req.Stdout), execproc.OrDiscard(req.Stderr)}
	for i, f := range sio.readers {
		w := &trackingWriter{w: dests[i]}
		r.writers = append(r.writers, w)
		r.copies.Add(1)
		go func() {
			defer r.copies.Done()
			if _, err := io.Copy(w, &sandboxagent.DrainReader{F: f}); err != nil && w.err != nil {
				r.failOnce.Do(func() { close(r.failed) })
			}
		}()
	}
	r.stdin = func() {}
	if req.Stdin != nil {
		r.stdin = feedAgentStdin(req.Stdin, sio)
	}
	go r.end()
	return r
}

// end closes ended: output read to its end after the exit, or cut
// outputGrace later.
func (r *agentRun) end() {
	defer close(r.ended)
	select {
	case <-r.exited:
	case <-r.failed:
		return
	}
	drained := make(chan struct{})
	go func() { r.copies.Wait(); close(drained) }()
	t := time.NewTimer(outputGrace)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
		r.cut()
		<-drained
	case <-r.failed:
	}
}

// cut ends the output copies once they have taken what the pipes hold
// now (sandboxagent.DrainReader).
func (r *agentRun) cut() {
	for _, f := range r.sio.readers {
		_ = f.SetReadDeadline(time.Unix(1, 0))
	}
}

// stop ends what still runs on boxrt's side and waits for it.
func (r *agentRun) stop() {
	r.stdin()
	r.cut()
	r.copies.Wait()
	<-r.ended
}

func (r *agentRun) writeErr() error {
	for _, w := range r.writers {
		if w.err != nil {
			return w.err
		}
	}
	return nil
}

// kill kills the command's process group through the agent; a command
// still there after killGrace (the agent did not do it, or cannot) ends
// with its container, which is started again. restarted says whether it
// was.
func (r *agentRun) kill(ctx context.Context, l *agentLink, conn *sandboxagent.Conn) (restarted bool) {
	_ = r.proc.Signal(syscall.SIGKILL)
	t := time.NewTimer(killGrace)
	defer t.Stop()
	select {
	case <-r.exited:
	case <-t.C:
		restarted = l.restartFor(ctx, conn)
		<-r.exited
	}
	return restarted
}

// restartFor restarts the container if conn is still its agent's, for the
// caller to report; false when someone else did.
func (l *agentLink) restartFor(ctx context.Context, conn *sandboxagent.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != conn {
		conn.Close()
		return false
	}
	if err := l.restart(ctx); err != nil {
		l.disconnect()
	}
	l.restarted = false
	return true
}

// feedAgentStdin copies stdin to the command until EOF, then closes the
// command's stdin (on a terminal, which has no half-close, it types the
// end-of-file character). The returned func ends the copy and waits for it.
func feedAgentStdin(stdin io.ReadCloser, sio *agentIO) func() {
	dst := sio.stdinW
	if sio.master != nil {
		dst = sio.master
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(dst, stdin); err != nil {
			return
		}
		if sio.tty {
			_, _ = dst.Write([]byte{veof})
			return
		}
		_ = dst.Close()
	}()
	return func() {
		stdin.Close()
		_ = dst.SetWriteDeadline(time.Unix(1, 0))
		<-done
	}
}
