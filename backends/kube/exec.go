package kube

import (
	"context"
	"errors"
	"io"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
	"github.com/boxrt/boxrt/internal/boxerr"
)

const (
	// killGrace is how long a kill may take before the next, blunter step.
	killGrace = 5 * time.Second
	// helperTimeout bounds a helper exec (signalling a process tree).
	helperTimeout = 15 * time.Second
	// pidDir holds the pid files of execs and managed processes: a small
	// emptyDir in memory of boxrt's own, out of the user's /tmp.
	pidDir = "/run/boxrt"
	// legacyPidDir is where Pods an earlier boxrt made (without pidDir)
	// keep them: their /tmp.
	legacyPidDir = "/tmp"
)

// pidDirOf is where the pid files of Pod pod go.
func (b *Backend) pidDirOf(pod string) string {
	if _, ok := b.legacy.Load(pod); ok {
		return legacyPidDir
	}
	return pidDir
}

// noteLegacy records whether pod, adopted, lacks the pidDir volume.
func (b *Backend) noteLegacy(pod *corev1.Pod) {
	b.noAgent.Store(pod.Name, true)
	for _, v := range pod.Spec.Volumes {
		if v.Name == agentVolume {
			b.noAgent.Delete(pod.Name)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == runVolume {
			b.legacy.Delete(pod.Name)
			return
		}
	}
	b.legacy.Store(pod.Name, true)
}

// killRequest is what Exec writes to the watcher's stdin; any line (or EOF)
// triggers the kill.
var killRequest = []byte("kill\n")

// envPrelude exports the environment, which the exec subresource cannot
// pass: $1 is the number of NAME=VALUE words that follow; they are shifted
// away so the wrapped script sees its own positional parameters.
const envPrelude = `
bk_n=$1
shift
while [ "$bk_n" -gt 0 ]; do export "$1"; shift; bk_n=$((bk_n - 1)); done
`

// envArgs renders env for envPrelude, sorted for reproducible commands.
func envArgs(env map[string]string) []string {
	out := make([]string, 0, len(env)+1)
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return append([]string{strconv.Itoa(len(out))}, out...)
}

// executor opens a command in the session's container through the Pod exec
// subresource: WebSocket (the v5 protocol carries stdin close), SPDY only
// when the server refuses the WebSocket upgrade. With tty the container's
// side is a terminal, whose output is all one stream (no stderr).
func (b *Backend) executor(pod string, cmd []string, tty bool) (remotecommand.Executor, error) {
	req := b.api.core.Post().Namespace(b.ns).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: containerName,
			Command:   cmd,
			Stdin:     true,
			Stdout:    true,
			Stderr:    !tty,
			TTY:       tty,
		}, parameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(b.rc, "GET", req.URL().String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(b.rc, "POST", req.URL())
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// exitCode reads a finished stream's outcome: the command's exit code, or
// the error that kept the stream from completing.
func exitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee utilexec.ExitError
	if errors.As(err, &ee) && ee.Exited() {
		return ee.ExitStatus(), nil
	}
	return -1, err
}

// Exec implements backends.Backend. Output streams into req.Stdout and
// req.Stderr as it arrives. On req.Timeout or ctx cancellation the
// command's whole process tree is killed inside the Pod, which stays.
//
// The live fields work as on docker. A command with a stdin or a terminal
// owns the exec's stdin, so it runs under sandboxsh.InteractiveScript
// (no watcher): a kill, and the sweep of what a signalled command leaves
// behind when it ends, go through a helper exec and its pid file. A
// command that may only be signalled keeps the watcher, in live mode,
// which does that sweep itself when boxrt closes the exec's stdin. What a
// command that ended on its own left running stays, as through the agent.
// Signals go to the whole tree through a helper exec (SignalScript).
func (b *Backend) Exec(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	if b.configErr != nil {
		return backends.ExitStatus{}, b.configErr
	}
	if err := ctx.Err(); err != nil {
		return backends.ExitStatus{}, err
	}
	pod := info.BackendSessionID
	if b.usesAgent(pod) && !b.warming(pod) {
		// Without an agent (an image without sh, …) commands run as
		// execs of their own.
		conn, restarted, err := b.agentConn(ctx, pod)
		var off *noAgentError
		switch {
		case err == nil:
			return b.execAgent(ctx, info, req, conn, restarted)
		case !errors.As(err, &off):
			return backends.ExitStatus{}, b.agentError(ctx, info, err)
		}
	}
	workdir, pidFile := execproc.Paths(info, req.Workdir, "exec", b.pidDirOf(info.BackendSessionID))
	ex, err := b.executor(pod, execCommand(req, workdir, pidFile), req.TTY != nil)
	if err != nil {
		return backends.ExitStatus{}, b.apiError("preparing exec in Pod "+pod, err)
	}
	defer b.touch(ctx, pod)

	stdout := &errWriter{w: execproc.OrDiscard(req.Stdout)}
	stderr := &errWriter{w: execproc.OrDiscard(req.Stderr)}
	// The stream outlives ctx on the kill path: the watcher must get the
	// kill request through it.
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	defer scancel()
	ended := make(chan struct{})
	opts, watcher, sizes := streamOptions(req, stdout, stderr, ended)
	if watcher != nil {
		defer watcher.Close()
	}
	if req.Stdin != nil {
		// Ends a Read still pending in the stream's stdin copier, which
		// the stream does not wait for.
		defer req.Stdin.Close()
	}
	var streamErr error // valid once ended is closed
	go func() {
		streamErr = ex.StreamWithContext(sctx, opts)
		close(ended)
	}()

	interactive := req.Stdin != nil || req.TTY != nil
	var signalled atomic.Bool
	status, finished, err := execproc.Await(ctx, req, execproc.Running{
		Ended: ended,
		Resize: func(size backends.TTYSize) error {
			return b.resize(ctx, pod, pidFile, sizes, size)
		},
		Signal: func(sig syscall.Signal) {
			if name, ok := sandboxsh.SignalNames[sig]; ok {
				signalled.Store(true)
				_ = b.signal(ctx, pod, pidFile, name, false)
			}
		},
		Kill: func() { b.killExec(ctx, pod, pidFile, watcher, ended, scancel) },
	})
	if !finished {
		return status, err
	}
	return b.execResult(ctx, info, pidFile, streamErr, firstErr(stdout.err(), stderr.err()), interactive, signalled.Load())
}

// execCommand is the argv of req's command, run in workdir under its
// wrapper script with its pid file at pidFile.
func execCommand(req backends.ExecRequest, workdir, pidFile string) []string {
	script, mode := sandboxsh.ExecScript, ""
	switch {
	case req.TTY != nil:
		script, mode = sandboxsh.InteractiveScript, "tty"
	case req.Stdin != nil:
		script = sandboxsh.InteractiveScript
	case req.Signals != nil:
		mode = "live"
	}
	cmd := append([]string{"sh", "-c", envPrelude + script, "boxrt-exec"}, envArgs(req.Env)...)
	return append(cmd, workdir, req.Cmd, pidFile, mode, sandboxsh.ShellFlags(req.NoLogin))
}

// streamOptions wires req's stdin and terminal, and the output writers,
// into the exec stream; ended is closed once the stream has ended. watcher
// is the stdin of the wrapper's watcher when the command has no stdin of
// its own (else nil); sizes is the terminal's size queue (nil without a
// terminal).
func streamOptions(req backends.ExecRequest, stdout, stderr io.Writer, ended <-chan struct{}) (opts remotecommand.StreamOptions, watcher *io.PipeWriter, sizes *sizeQueue) {
	opts = remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr}
	switch {
	case req.TTY != nil:
		opts.Stderr = nil
		opts.Tty = true
		opts.Stdin = &ttyStdin{ended: ended}
		if req.Stdin != nil {
			opts.Stdin = &ttyStdin{r: req.Stdin, ended: ended}
		}
		sizes = &sizeQueue{first: &remotecommand.TerminalSize{Height: req.TTY.Rows, Width: req.TTY.Cols},
			next: make(chan *remotecommand.TerminalSize), ended: ended}
		opts.TerminalSizeQueue = sizes
	case req.Stdin != nil:
		// Its EOF closes the command's stdin (the v5 protocol's close).
		opts.Stdin = req.Stdin
	default:
		// The watcher in ExecScript reads this pipe: it stays open while
		// the command runs; a line (or its close, or the stream breaking)
		// kills.
		var stdinR io.Reader
		stdinR, watcher = io.Pipe()
		opts.Stdin = stdinR
	}
	return opts, watcher, sizes
}

// execResult is the result of an exec whose stream has ended with
// streamErr; writeErr is the first error of the caller's output writers.
func (b *Backend) execResult(ctx context.Context, info backends.Session, pidFile string, streamErr, writeErr error, interactive, signalled bool) (backends.ExitStatus, error) {
	code, serr := exitCode(streamErr)
	if serr == nil {
		if interactive && signalled {
			// What a signalled command left behind (a child that ignored
			// the signal) goes with it, as on docker; what one that ended
			// on its own left running stays.
			_ = b.signal(ctx, info.BackendSessionID, pidFile, "KILL", true)
		}
		return backends.ExitStatus{ExitCode: code}, nil
	}
	if writeErr != nil || interactive {
		// A failing writer: nobody would see the rest. A broken stream: a
		// watcher has seen it end and killed, but an interactive exec has
		// none.
		_ = b.signal(ctx, info.BackendSessionID, pidFile, "KILL", true)
	}
	if writeErr != nil {
		return backends.ExitStatus{}, boxerr.Failure("writing command output: %v", writeErr).Wrap(writeErr)
	}
	return backends.ExitStatus{}, b.execError(ctx, info, "running command", serr)
}

// resize hands a new size to the stream's size queue, then waits (a helper
// exec, sandboxsh.TTYSizeCommand) until the command's terminal has it, so that what
// the caller does next sees it: the size and the keystrokes after it
// travel on different channels of the exec stream.
func (b *Backend) resize(ctx context.Context, pod, pidFile string, q *sizeQueue, size backends.TTYSize) error {
	if q == nil {
		return boxerr.Validation("resize", "the command has no terminal")
	}
	select {
	case q.next <- &remotecommand.TerminalSize{Height: size.Rows, Width: size.Cols}:
	case <-q.ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	return b.helper(ctx, pod, "resizing the terminal of an exec", sandboxsh.TTYSizeCommand(pidFile, size.Rows, size.Cols))
}

// sizeQueue is the stream's remotecommand.TerminalSizeQueue: the initial
// size, then each resize, until the stream ends.
type sizeQueue struct {
	first *remotecommand.TerminalSize
	next  chan *remotecommand.TerminalSize
	ended <-chan struct{}
}

// Next is called by one goroutine of the stream only.
func (q *sizeQueue) Next() *remotecommand.TerminalSize {
	if s := q.first; s != nil {
		q.first = nil
		return s
	}
	select {
	case s := <-q.next:
		return s
	case <-q.ended:
		return nil
	}
}

// ttyStdin is a terminal's input (r nil: nothing is typed). A terminal has
// no half-close: at the end of r it types the end-of-file character, and
// then blocks until the stream has ended.
type ttyStdin struct {
	r     io.Reader
	ended <-chan struct{}
	// eof: r has ended; typed: so has the end-of-file character.
	eof, typed bool
}

// veof is the terminal's end-of-file character (^D).
const veof = 0x04

func (t *ttyStdin) Read(p []byte) (int, error) {
	if t.r != nil && !t.eof {
		n, err := t.r.Read(p)
		if err != io.EOF {
			return n, err
		}
		t.eof = true
		if n > 0 {
			return n, nil
		}
	}
	if t.r != nil && !t.typed && len(p) > 0 {
		t.typed = true
		p[0] = veof
		return 1, nil
	}
	<-t.ended
	return 0, io.EOF
}

// killExec kills a running exec's process tree. The in-Pod watcher (when
// the exec has one) is asked first: it needs no new process, so it works
// under an exhausted pids limit. Then, once the stream has ended or
// killGrace has passed, a second exec kills the session recorded in the
// pid file (the only way left if the watcher itself was killed), waits for
// the zombies to be reaped and deletes the file; then the stream is cut.
// An interactive exec has no watcher (its stdin is the command's): only
// the second step applies, and it also sweeps what a TERM-proof child kept
// running.
func (b *Backend) killExec(ctx context.Context, pod, pidFile string, watcher *io.PipeWriter, ended <-chan struct{}, cancel context.CancelFunc) {
	t := time.NewTimer(killGrace)
	defer t.Stop()
	streamEnded := false
	if watcher != nil {
		go func() { _, _ = watcher.Write(killRequest) }()
		select {
		case <-ended:
			streamEnded = true
		case <-t.C:
		}
		t.Reset(killGrace)
	}
	_ = b.signal(ctx, pod, pidFile, "KILL", true)
	if streamEnded {
		return
	}
	select {
	case <-ended:
	case <-t.C:
		cancel()
		<-ended
	}
}

// signal sends sig to the process session recorded in pidFile inside pod
// through a second exec (sandboxsh.SignalScript).
func (b *Backend) signal(ctx context.Context, pod, pidFile, sig string, cleanup bool) error {
	cmd := []string{"sh", "-c", sandboxsh.SignalScript, "boxrt-signal", pidFile, sig}
	if cleanup {
		cmd = append(cmd, "cleanup")
	}
	return b.helper(ctx, pod, "signalling processes", cmd)
}

// helper runs a short boxrt-owned command in pod and waits for it (at most
// helperTimeout, even past ctx: it is bookkeeping of a command that ends).
func (b *Backend) helper(ctx context.Context, pod, what string, cmd []string) error {
	ctx, cancel := cleanupContext(ctx, helperTimeout)
	defer cancel()
	ex, err := b.executor(pod, cmd, false)
	if err != nil {
		return b.apiError(what+" in Pod "+pod, err)
	}
	out := &execproc.LimitedBuffer{Max: 4096}
	code, err := exitCode(ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: eofReader{}, Stdout: out, Stderr: out}))
	if err != nil {
		return b.apiError(what+" in Pod "+pod, err)
	}
	if code != 0 {
		return boxerr.Failure("kube backend: %s in Pod %s: exit %d: %s", what, pod, code, out.String())
	}
	return nil
}

// execError: when the Pod is gone, the failure is the session being gone.
func (b *Backend) execError(ctx context.Context, info backends.Session, what string, err error) *boxerr.Error {
	ictx, cancel := cleanupContext(ctx, helperTimeout)
	defer cancel()
	pod, gerr := b.pods().Get(ictx, info.BackendSessionID, metav1.GetOptions{})
	if (gerr != nil && ignoreNotFound(gerr) == nil) || (gerr == nil && !podRunning(pod)) {
		e := boxerr.SessionNotFound(info.SessionID).With("reason", "pod gone").Wrap(err)
		e.Msg += ": its Pod " + info.BackendSessionID + " is gone or not running"
		return e
	}
	return b.apiError(what+" in Pod "+info.BackendSessionID, err)
}

// errWriter remembers the first error of w, so a failed stream can be told
// apart from a failing caller.
type errWriter struct {
	w   io.Writer
	mu  sync.Mutex
	bad error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.mu.Lock()
		if e.bad == nil {
			e.bad = err
		}
		e.mu.Unlock()
	}
	return n, err
}

func (e *errWriter) err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bad
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// eofReader is an stdin that is closed at once.
type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
