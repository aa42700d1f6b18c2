package docker

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/internal/boxerr"
)

const (
	// killGrace is how long a kill may take before the next, blunter step.
	killGrace = 5 * time.Second
	// helperTimeout bounds the bookkeeping calls made after a command ended
	// or while killing it, which run on a context detached from the caller's.
	helperTimeout = 15 * time.Second
	// helperAttempts: a helper exec needs a free pid in the container, which
	// a runaway command may hold for a moment.
	helperAttempts = 5
	// stopWait is how long an exec that ended by a signal (or with the
	// engine's 126) waits to learn whether its container is going down.
	stopWait = time.Second
	// stopConfirm is how much longer that exec waits when the container
	// can no longer run a new exec (see stopping).
	stopConfirm = 5 * time.Second
)

// killRequest is what Exec writes to the watcher's stdin; any line (or EOF)
// triggers the kill.
var killRequest = []byte("kill\n")

// ExecCommand is the argv of a plain box_exec of cmd in workdir, with its
// pid file at pidFile: the wrapper every such command runs in (login shell,
// kill watcher; see sandboxsh.ExecScript), with the exec's stdin attached
// for the watcher. The bench runs it through the raw Engine API as the
// floor of this design.
func ExecCommand(workdir, cmd, pidFile string) []string {
	return execArgv(execScript, workdir, cmd, pidFile, "", false)
}

func execArgv(script, workdir, cmd, pidFile, mode string, noLogin bool) []string {
	return []string{"sh", "-c", script, "boxrt-exec", workdir, cmd, pidFile, mode, shellFlags(noLogin)}
}

// Exec implements backends.Backend. Output is demultiplexed into req.Stdout
// and req.Stderr as it arrives. On req.Timeout or ctx cancellation the
// command's whole process tree is killed inside the container and the
// container, with its files, stays. A plain exec runs in the exec started
// after the session's previous one (see prestartNext) and starts the next.
func (b *Backend) Exec(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	if err := ctx.Err(); err != nil {
		return backends.ExitStatus{}, err
	}
	req.Env = b.execEnv(info.BackendSessionID, req.Env)
	if l, err := b.link(ctx, info); err != nil {
		return backends.ExitStatus{}, err
	} else if l != nil {
		return b.agentExec(ctx, info, l, req)
	}
	status, err := b.exec(ctx, info, req)
	if err == nil && req.Plain() {
		b.prestartNext(info)
	}
	return status, err
}

func (b *Backend) exec(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	if err := ctx.Err(); err != nil {
		return backends.ExitStatus{}, err
	}
	workdir, pidFile := execproc.Paths(info, req.Workdir, "exec", b.pidDirOf(info.BackendSessionID))
	opts, mode := execOptions(req, workdir, pidFile)
	execID, hj, err := b.startExec(ctx, info, req, opts, workdir, pidFile, mode)
	if err != nil {
		return backends.ExitStatus{}, err
	}
	s := newStream(&hj, opts.Tty, execproc.OrDiscard(req.Stdout), execproc.OrDiscard(req.Stderr))
	defer s.close()
	if req.TTY != nil {
		// Engines before API 1.42 ignore ConsoleSize at creation: size the
		// terminal now, as the docker CLI does after starting an exec.
		_ = b.cli.ContainerExecResize(ctx, execID, container.ResizeOptions{Height: uint(req.TTY.Rows), Width: uint(req.TTY.Cols)})
	}
	if req.Stdin != nil {
		feed := feedStdin(&hj, req.Stdin, opts.Tty)
		defer feed()
	}
	exited, stopWatch := b.exitWatch(ctx, info)
	defer stopWatch()
	interactive := req.Stdin != nil || req.TTY != nil
	var signalled atomic.Bool
	status, ended, err := execproc.Await(ctx, req, execproc.Running{
		Ended: s.done,
		Resize: func(size backends.TTYSize) error {
			return b.resize(ctx, info, execID, pidFile, size)
		},
		Signal: func(sig syscall.Signal) {
			if name, ok := signalNames[sig]; ok {
				signalled.Store(true)
				_ = b.signalSession(ctx, info.BackendSessionID, "", pidFile, name, false)
			}
		},
		Kill:        func() { b.killExec(ctx, info, execID, pidFile, s, !interactive, true) },
		SandboxDied: exited,
		SandboxDiedResult: func() (backends.ExitStatus, error) {
			return b.sandboxDied(ctx, info)
		},
	})
	if !ended {
		return status, err
	}
	return b.execResult(ctx, info, execID, pidFile, s, interactive, signalled.Load())
}

// execOptions is the Engine exec of req's command, in workdir with its pid
// file at pidFile, and the mode its wrapper script runs in.
//
// A command that reads its stdin (or has a terminal) owns the exec's
// stdin, so the in-container watcher that kills on a line from boxrt
// cannot be used: those execs are killed through a helper exec and their
// pid file (see interactiveScript). An exec that may be signalled keeps
// the watcher, in live mode (see execScript).
func execOptions(req backends.ExecRequest, workdir, pidFile string) (_ container.ExecOptions, mode string) {
	script := execScript
	switch {
	case req.TTY != nil:
		script, mode = interactiveScript, "tty"
	case req.Stdin != nil:
		script = interactiveScript
	case req.Signals != nil:
		mode = "live"
	}
	opts := container.ExecOptions{
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		Env:          envList(req.Env),
		// The wrapper creates and enters the real workdir; the engine would
		// refuse a working directory that does not exist yet.
		WorkingDir: "/",
		Cmd:        execArgv(script, workdir, req.Cmd, pidFile, mode, req.NoLogin),
	}
	if req.TTY != nil {
		opts.Tty = true
		opts.ConsoleSize = &[2]uint{uint(req.TTY.Rows), uint(req.TTY.Cols)}
	}
	return opts, mode
}

// startExec starts the exec opts describes: the session's prestarted one
// when it fits, else a new one.
func (b *Backend) startExec(ctx context.Context, info backends.Session, req backends.ExecRequest, opts container.ExecOptions, workdir, pidFile, mode string) (string, types.HijackedResponse, error) {
	if p, ok := b.usePrestarted(ctx, info.BackendSessionID, req, workdir, req.Cmd, pidFile, mode, shellFlags(req.NoLogin)); ok {
		return p.id, p.hj, nil
	}
	created, err := b.cli.ContainerExecCreate(ctx, info.BackendSessionID, opts)
	if err != nil {
		return "", types.HijackedResponse{}, b.execError(ctx, info, "creating exec in "+info.BackendSessionID, err)
	}
	// Attach is the start: the engine runs the exec when the hijacked
	// stream is set up, so there is no separate ContainerExecStart.
	hj, err := b.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{Tty: opts.Tty, ConsoleSize: opts.ConsoleSize})
	if err != nil {
		return "", types.HijackedResponse{}, b.execError(ctx, info, "starting exec in "+info.BackendSessionID, err)
	}
	return created.ID, hj, nil
}

// execResult reads the outcome of an exec whose output stream has ended.
func (b *Backend) execResult(ctx context.Context, info backends.Session, execID, pidFile string, s *stream, interactive, signalled bool) (backends.ExitStatus, error) {
	if s.err != nil {
		// Either the caller's writer failed or the engine connection broke;
		// in both cases nobody would see the rest, so stop it.
		b.killExec(ctx, info, execID, pidFile, s, !interactive, false)
		if werr := s.writeErr(); werr != nil {
			return backends.ExitStatus{}, boxerr.Failure("writing command output: %v", werr).Wrap(werr)
		}
		return backends.ExitStatus{}, b.execError(ctx, info, "reading command output", s.err)
	}
	ictx, cancel := cleanupContext(ctx, helperTimeout)
	defer cancel()
	code, err := b.execExitCode(ictx, execID)
	if err != nil {
		return backends.ExitStatus{}, b.execError(ictx, info, "reading exit code", err)
	}
	// 126 is what the engine reports when it could not start the exec in a
	// container that was stopping (its error text is then the "output"),
	// and a signal exit is what every process gets when the container
	// dies. Either way the result says nothing about the command.
	// runsc answers 128 for an exec whose sandbox died under it.
	if code == 128 && b.OnGVisor(info.Sandbox) && b.stopping(ictx, info) {
		return b.sandboxDied(ictx, info)
	}
	if (code == 126 || code > 128) && b.stopping(ictx, info) {
		return backends.ExitStatus{}, containerGone(info, code)
	}
	if interactive && signalled {
		// A signalled exec was being killed: what the command left behind
		// (a child that ignored the signal) goes with it, and the pid file
		// the wrapper kept for this. (A killed exec had the same sweep in
		// killExec.) What a command that ended on its own left running
		// stays, and its wrapper removed the pid file.
		_ = b.signalSession(ictx, info.BackendSessionID, "", pidFile, "KILL", true)
	}
	return backends.ExitStatus{ExitCode: code}, nil
}

// resize sizes an exec's terminal, then waits (a helper exec) until the
// command's terminal has the new size, so that what the caller does next
// sees it: Podman applies the resize after it has answered the call.
func (b *Backend) resize(ctx context.Context, info backends.Session, execID, pidFile string, size backends.TTYSize) error {
	err := b.cli.ContainerExecResize(ctx, execID, container.ResizeOptions{Height: uint(size.Rows), Width: uint(size.Cols)})
	if err == nil {
		err = b.runHelper(ctx, info.BackendSessionID, "", ttySizeCommand(pidFile, size.Rows, size.Cols))
	}
	if err != nil {
		return b.apiError("resizing the terminal of an exec in "+info.BackendSessionID, err)
	}
	return nil
}

// execError is sessionError for a failed exec: when the container has
// stopped meanwhile, the failure is the session being gone; when the
// engine stopped answering (a broken stream, then nothing), the engine is
// unavailable and the command's outcome unknown, which is retryable.
func (b *Backend) execError(ctx context.Context, info backends.Session, what string, err error) *boxerr.Error {
	ictx, cancel := cleanupContext(ctx, helperTimeout)
	defer cancel()
	if !cerrdefs.IsNotFound(err) && b.stopped(ictx, info) {
		return containerGone(info, -1).Wrap(err)
	}
	if !cerrdefs.IsNotFound(err) && b.engineDown(ictx) {
		return boxerr.BackendUnavailable("Docker engine at %s stopped answering while %s (%v): the command may or may not have run; "+
			"the session is kept: retry once the engine is back", b.cli.DaemonHost(), what, err).With("session_id", info.SessionID).Wrap(err)
	}
	return b.sessionError(info, what, err)
}

// stopped reports whether the session's container is gone or not running.
// An engine that cannot answer does not count as stopped.
func (b *Backend) stopped(ctx context.Context, info backends.Session) bool {
	c, err := b.cli.ContainerInspect(ctx, info.BackendSessionID)
	if err != nil {
		return cerrdefs.IsNotFound(err)
	}
	return c.State == nil || !c.State.Running
}

// stopping is stopped for a container that may be on its way down: the
// engine marks it exited only once its runtime has reported the end, a
// moment after its processes are gone — on a loaded host Podman takes
// longer than stopWait. So when stopWait passes, a new exec decides: a
// container that still runs one is up (costing stopWait and that exec);
// one that cannot gets stopConfirm more for the engine to say it stopped.
// Only the engine's word counts as stopped: a wrong "stopped" would make
// box_exec recreate the session and run the command again.
func (b *Backend) stopping(ctx context.Context, info backends.Session) bool {
	if b.waitNotRunning(ctx, info, stopWait) {
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	// Bounded: dockerd does not end the streams of an exec in a gVisor
	// sandbox that died.
	pctx, cancel := context.WithTimeout(ctx, stopConfirm)
	defer cancel()
	if b.runHelper(pctx, info.BackendSessionID, "", []string{"true"}) == nil {
		return false
	}
	return b.waitNotRunning(ctx, info, stopConfirm)
}

// waitNotRunning waits up to d for the engine to report the session's
// container not running (or gone).
func (b *Backend) waitNotRunning(ctx context.Context, info backends.Session, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	waitC, errC := b.cli.ContainerWait(ctx, info.BackendSessionID, container.WaitConditionNotRunning)
	select {
	case <-waitC:
		return true
	case err := <-errC:
		return cerrdefs.IsNotFound(err)
	}
}

// containerGone is the typed error of an exec whose container stopped; the
// runtime recreates the session on it, as for a vanished container.
func containerGone(info backends.Session, code int) *boxerr.Error {
	e := boxerr.SessionNotFound(info.SessionID).With("reason", "container stopped")
	e.Msg += ": its container " + info.BackendSessionID + " stopped"
	if code >= 0 {
		e = e.With("engine_exit_code", code)
	}
	return e
}

// killExec kills a running exec's process tree. The in-container watcher is
// asked first: it needs no new process, so it works under an exhausted pids
// limit. Then a second exec kills whatever is left of the session recorded
// in the pid file, waits for the zombies to be reaped (each holds a pid
// the session's next command needs) and deletes the file. It is the only
// way left when the watcher itself was killed by the command; the exec
// ending is no proof, since the engine closes the stream two seconds after
// the wrapper exits whoever still holds it.
//
// An interactive exec has no watcher (its stdin is the command's): only
// the second step applies.
func (b *Backend) killExec(ctx context.Context, info backends.Session, execID, pidFile string, s *stream, watcher, streamLive bool) {
	ctx, cancel := cleanupContext(ctx, 3*killGrace)
	defer cancel()
	ended := false
	if watcher {
		_ = s.hj.Conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = s.hj.Conn.Write(killRequest)
		ended = b.waitExecEnd(ctx, execID, s, streamLive)
	}
	_ = b.signalSession(ctx, info.BackendSessionID, "", pidFile, "KILL", true)
	if !ended {
		b.waitExecEnd(ctx, execID, s, streamLive)
	}
}

// waitExecEnd waits up to killGrace for an exec to end. While its output
// stream is being read, the stream's end is the better signal: it closes
// only once every process holding the output is gone. Otherwise the exec's
// main process exiting has to do.
func (b *Backend) waitExecEnd(ctx context.Context, execID string, s *stream, streamLive bool) bool {
	deadline := time.NewTimer(killGrace)
	defer deadline.Stop()
	if streamLive {
		select {
		case <-s.done:
			return true
		case <-deadline.C:
		case <-ctx.Done():
		}
		return false
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if ins, err := b.cli.ContainerExecInspect(ctx, execID); err != nil || !ins.Running {
			return true
		}
		select {
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// execExitCode waits for the engine to record the exit of an exec whose
// stream has ended; the two are not ordered on every engine version.
func (b *Backend) execExitCode(ctx context.Context, execID string) (int, error) {
	delay := time.Millisecond
	for {
		ins, err := b.cli.ContainerExecInspect(ctx, execID)
		if err != nil {
			return -1, err
		}
		if !ins.Running {
			return ins.ExitCode, nil
		}
		if err := sleepCtx(ctx, delay); err != nil {
			return -1, err
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// signalSession sends sig to the process session recorded in pidFile inside
// the container, retrying while the container has no pid to spare. user is
// who the session's processes run as ("" for the container's user): with
// every capability dropped only the same user may signal them.
func (b *Backend) signalSession(ctx context.Context, containerName, user, pidFile, sig string, cleanup bool) error {
	cmd := []string{"sh", "-c", signalScript, "boxrt-signal", pidFile, sig}
	if cleanup {
		cmd = append(cmd, "cleanup")
	}
	var err error
	for i := 0; i < helperAttempts; i++ {
		if err = b.runHelper(ctx, containerName, user, cmd); err == nil || ctx.Err() != nil {
			break
		}
		if sleepCtx(ctx, time.Duration(i+1)*100*time.Millisecond) != nil {
			break
		}
	}
	if err != nil {
		return b.apiError("signalling processes in "+containerName, err)
	}
	return nil
}

// runHelper runs a short boxrt-owned command in the container as user (""
// for the container's) and waits for it, returning its output in the error
// when it fails.
func (b *Backend) runHelper(ctx context.Context, containerName, user string, cmd []string) error {
	created, err := b.cli.ContainerExecCreate(ctx, containerName, container.ExecOptions{
		User:         user,
		AttachStdout: true,
		AttachStderr: true,
		WorkingDir:   "/",
		Cmd:          cmd,
	})
	if err != nil {
		return err
	}
	hj, err := b.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return err
	}
	out := &execproc.LimitedBuffer{Max: 4096}
	s := newStream(&hj, false, out, out)
	select {
	case <-s.done:
	case <-ctx.Done():
	}
	s.close()
	if err := ctx.Err(); err != nil {
		return err
	}
	code, err := b.execExitCode(ctx, created.ID)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("helper exited with code %d: %s", code, strings.TrimSpace(out.String()))
	}
	return nil
}

// stream demultiplexes a hijacked exec connection into two writers on its
// own goroutine. close ends it and waits for the goroutine, so an Exec never
// returns with a reader still running.
type stream struct {
	hj     *types.HijackedResponse
	done   chan struct{}
	err    error // valid after done
	stdout *trackingWriter
	stderr *trackingWriter
}

// With a terminal (tty) the engine sends the terminal's output as it is,
// not multiplexed: all of it goes to stdout.
func newStream(hj *types.HijackedResponse, tty bool, stdout, stderr io.Writer) *stream {
	s := &stream{
		hj:     hj,
		done:   make(chan struct{}),
		stdout: &trackingWriter{w: stdout},
		stderr: &trackingWriter{w: stderr},
	}
	go func() {
		defer close(s.done)
		if tty {
			_, s.err = io.Copy(s.stdout, hj.Reader)
			return
		}
		_, s.err = stdcopy.StdCopy(s.stdout, s.stderr, hj.Reader)
	}()
	return s
}

// feedStdin copies stdin to the exec's stdin until EOF, then closes it
// (on a terminal, which has no half-close, it types the end-of-file
// character instead). The returned func closes stdin, which ends a read
// still pending, and waits for the copy.
func feedStdin(hj *types.HijackedResponse, stdin io.ReadCloser, tty bool) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(hj.Conn, stdin); err != nil {
			return
		}
		if tty {
			_, _ = hj.Conn.Write([]byte{veof})
			return
		}
		_ = hj.CloseWrite()
	}()
	return func() {
		stdin.Close()
		<-done
	}
}

// veof is the terminal's end-of-file character (^D).
const veof = 0x04

func (s *stream) close() {
	s.hj.Close()
	<-s.done
}

// writeErr is the error of the caller's writer, if that is what stopped the
// stream. Valid after done.
func (s *stream) writeErr() error {
	if s.stdout.err != nil {
		return s.stdout.err
	}
	return s.stderr.err
}

// trackingWriter remembers its first write error, to tell a failing
// destination from a failing engine connection after StdCopy returns.
type trackingWriter struct {
	w   io.Writer
	err error
}

func (t *trackingWriter) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	if err != nil && t.err == nil {
		t.err = err
	}
	return n, err
}
