package kube

import (
	"context"
	"errors"
	"io"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

const (
	// killGrace is how long a kill may take before the next, blunter step.
	killGrace = 5 * time.Second
	// helperTimeout bounds a helper exec (signalling a process tree).
	helperTimeout = 15 * time.Second
)

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
// when the server refuses the WebSocket upgrade.
func (b *Backend) executor(pod string, cmd []string) (remotecommand.Executor, error) {
	req := b.cs.CoreV1().RESTClient().Post().Namespace(b.ns).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: containerName,
			Command:   cmd,
			Stdin:     true,
			Stdout:    true,
			Stderr:    true,
		}, scheme.ParameterCodec)
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
func (b *Backend) Exec(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	if b.configErr != nil {
		return backends.ExitStatus{}, b.configErr
	}
	if err := ctx.Err(); err != nil {
		return backends.ExitStatus{}, err
	}
	workdir := req.Workdir
	if workdir == "" {
		workdir = info.MountPath
	}
	if workdir == "" {
		workdir = "/"
	}
	pidFile := "/tmp/.boxrt-exec-" + randomHex(16) + ".pid"
	cmd := append([]string{"sh", "-c", envPrelude + sandboxsh.ExecScript, "boxrt-exec"}, envArgs(req.Env)...)
	cmd = append(cmd, workdir, req.Cmd, pidFile)
	ex, err := b.executor(info.BackendSessionID, cmd)
	if err != nil {
		return backends.ExitStatus{}, b.apiError("preparing exec in Pod "+info.BackendSessionID, err)
	}
	defer b.touch(ctx, info.BackendSessionID)

	stdout := &errWriter{w: orDiscard(req.Stdout)}
	stderr := &errWriter{w: orDiscard(req.Stderr)}
	// The watcher in ExecScript reads this pipe: it stays open while the
	// command runs; a line (or its close, or the stream breaking) kills.
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	// The stream outlives ctx on the kill path: the watcher must get the
	// kill request through it.
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	defer scancel()
	done := make(chan error, 1)
	go func() {
		done <- ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: stdinR, Stdout: stdout, Stderr: stderr})
	}()

	var expired <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case err := <-done:
		code, serr := exitCode(err)
		if serr == nil {
			return backends.ExitStatus{ExitCode: code}, nil
		}
		if werr := firstErr(stdout.err(), stderr.err()); werr != nil {
			b.signal(ctx, info.BackendSessionID, pidFile, "KILL", true)
			return backends.ExitStatus{}, boxerr.Failure("writing command output: %v", werr).Wrap(werr)
		}
		return backends.ExitStatus{}, b.execError(ctx, info, "running command", serr)
	case <-expired:
		b.killExec(ctx, info.BackendSessionID, pidFile, stdinW, done, scancel)
		return backends.ExitStatus{TimedOut: true}, nil
	case <-ctx.Done():
		b.killExec(ctx, info.BackendSessionID, pidFile, stdinW, done, scancel)
		return backends.ExitStatus{TimedOut: true}, ctx.Err()
	}
}

// killExec kills a running exec's process tree. The in-Pod watcher is asked
// first: it needs no new process, so it works under an exhausted pids limit.
// If the stream has not ended within killGrace, a second exec kills the
// session recorded in the pid file; then the stream is cut.
func (b *Backend) killExec(ctx context.Context, pod, pidFile string, stdin *io.PipeWriter, done <-chan error, cancel context.CancelFunc) {
	go func() { _, _ = stdin.Write(killRequest) }()
	t := time.NewTimer(killGrace)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	b.signal(ctx, pod, pidFile, "KILL", true)
	t.Reset(killGrace)
	select {
	case <-done:
	case <-t.C:
		cancel()
		<-done
	}
}

// signal sends sig to the process session recorded in pidFile inside pod
// through a second exec (sandboxsh.SignalScript).
func (b *Backend) signal(ctx context.Context, pod, pidFile, sig string, cleanup bool) error {
	ctx, cancel := cleanupContext(ctx, helperTimeout)
	defer cancel()
	cmd := []string{"sh", "-c", sandboxsh.SignalScript, "boxrt-signal", pidFile, sig}
	if cleanup {
		cmd = append(cmd, "cleanup")
	}
	ex, err := b.executor(pod, cmd)
	if err != nil {
		return b.apiError("signalling processes in Pod "+pod, err)
	}
	out := &limitedBuffer{max: 4096}
	code, err := exitCode(ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: eofReader{}, Stdout: out, Stderr: out}))
	if err != nil {
		return b.apiError("signalling processes in Pod "+pod, err)
	}
	if code != 0 {
		return boxerr.Failure("kube backend: signalling processes in Pod %s: exit %d: %s", pod, code, out.String())
	}
	return nil
}

// execError: when the Pod is gone, the failure is the session being gone.
func (b *Backend) execError(ctx context.Context, info backends.Session, what string, err error) *boxerr.Error {
	ictx, cancel := cleanupContext(ctx, helperTimeout)
	defer cancel()
	pod, gerr := b.cs.CoreV1().Pods(b.ns).Get(ictx, info.BackendSessionID, metav1.GetOptions{})
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

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// eofReader is an stdin that is closed at once.
type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - len(l.buf); room > 0 {
		l.buf = append(l.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}
