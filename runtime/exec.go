package runtime

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/clip"
)

// Execution statuses on the wire.
const (
	StatusCompleted = "completed"
	StatusTimedOut  = "timed_out"
)

// ExecResult is the box_exec result. The byte counts are what the command
// wrote; the strings hold at most the configured cap of each stream.
type ExecResult struct {
	SessionID       string `json:"session_id"`
	BackendName     string `json:"backend_name"`
	Status          string `json:"status"`
	ExitCode        *int   `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	DurationMS      int64  `json:"duration_ms"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	// SessionCreated: this call created the session (first use, or its
	// sandbox was found gone), so the workspace is a fresh one.
	SessionCreated bool `json:"session_created"`
	// Restarted: the session's sandbox had to be started afresh for or
	// during this command (see backends.ExitStatus.Restarted).
	Restarted bool `json:"restarted"`
}

// ExecEvent describes a finished exec, for metrics.
type ExecEvent struct {
	SessionID string
	Backend   string
	Duration  time.Duration
	Status    string // completed, timed_out, or "" when it failed
	Truncated bool
	ErrType   string
}

// Exec runs spec.Cmd in the session spec.SessionID (created or reused as
// EnsureSession does). A timeout kills the command's process tree and keeps
// the session; its files and state survive.
func (e *Execs) Exec(ctx context.Context, spec Spec) (ExecResult, error) {
	return e.ExecWith(ctx, spec, ExecOptions{})
}

// ExecWith is Exec with live options: streamed output, a terminal, stdin.
// Such an exec has an id (in its chunks) by which Execs.Kill and friends
// reach it while it runs. Cancelling ctx kills the command's tree and
// answers with status canceled.
func (e *Execs) ExecWith(ctx context.Context, spec Spec, opts ExecOptions) (ExecResult, error) {
	start := time.Now()
	res, err := e.exec(ctx, spec, opts)
	e.observe(spec, res, err, time.Since(start))
	return res, err
}

// observe logs a finished exec and reports it to the exec observer.
func (e *Execs) observe(spec Spec, res ExecResult, err error, d time.Duration) {
	r := e.r
	ev := ExecEvent{SessionID: spec.SessionID, Backend: res.BackendName, Duration: d, Status: res.Status,
		Truncated: res.StdoutTruncated || res.StderrTruncated}
	log := r.log.Info()
	if err != nil {
		ev.ErrType = boxerr.TypeOf(err)
		log = r.log.Warn().Str("error_type", ev.ErrType).Str("error", clip.String(err.Error(), 300))
	} else if res.ExitCode != nil {
		log = log.Int("exit_code", *res.ExitCode)
	}
	envKeys := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		envKeys = append(envKeys, k)
	}
	sort.Strings(envKeys)
	log.Str("session_id", spec.SessionID).Str("backend", res.BackendName).Str("cmd", clip.String(spec.Cmd, 200)).
		Strs("env_keys", envKeys).Float64("duration_ms", float64(ev.Duration.Microseconds())/1000).
		Str("status", res.Status).Int64("stdout_bytes", res.StdoutBytes).Int64("stderr_bytes", res.StderrBytes).
		Bool("truncated", ev.Truncated).Msg("exec")
	if r.execObserver != nil {
		r.execObserver(ev)
	}
}

// MaxCmdBytes is the longest cmd: the kernel takes no single argument
// over MAX_ARG_STRLEN (128 KiB with its NUL), and a command is one.
const MaxCmdBytes = 128<<10 - 1

// checkCmd refuses an empty command and one no kernel would run.
func checkCmd(cmd string) error {
	switch {
	case cmd == "":
		return boxerr.Validation("cmd", "cmd must not be empty")
	case len(cmd) > MaxCmdBytes:
		return boxerr.Validation("cmd", "cmd is %d bytes, at most %d (the kernel's limit for one argument): write a long script to a file (box_fs_write) and run that", len(cmd), MaxCmdBytes)
	}
	return nil
}

func (e *Execs) exec(ctx context.Context, spec Spec, opts ExecOptions) (ExecResult, error) {
	if err := checkCmd(spec.Cmd); err != nil {
		return ExecResult{}, err
	}
	r := e.r
	var err error
	if spec.SessionID, err = resolve(ctx, spec.SessionID); err != nil {
		return ExecResult{}, err
	}
	for attempt := 0; ; attempt++ {
		s, created, err := r.acquire(ctx, spec, true)
		if err != nil {
			return ExecResult{}, err
		}
		res, gone, err := e.execIn(ctx, s, spec, opts)
		res.SessionCreated = created
		if !gone || attempt > 0 {
			return res, err
		}
		if e.restartStopped(ctx, spec.SessionID, s) {
			continue
		}
		// Reuse does not probe liveness before an exec (it costs an engine
		// round trip per call); an exec that fails on a sandbox that turns
		// out to be gone recreates the session once and runs there.
		r.log.Warn().Str("session_id", spec.SessionID).Err(err).Msg("sandbox is gone; recreating the session")
		if derr := r.destroy(ctx, s, "sandbox is gone", false); derr != nil {
			return res, err
		}
		r.counters.recreated.Add(1)
	}
}

// execIn runs spec.Cmd in s. gone reports a failure whose cause is that
// the sandbox no longer exists.
func (e *Execs) execIn(ctx context.Context, s *session, spec Spec, opts ExecOptions) (_ ExecResult, gone bool, _ error) {
	r := e.r
	defer r.sessions.releaseExec(s)

	s.execMu.Lock()
	defer s.execMu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Registered before the gate is passed: a Close that shuts it next
	// finds cancel (Execs.stopAll).
	info, deleting := r.sessions.startBoxExec(s, cancel)
	defer r.sessions.endBoxExec(s)
	shutting := !r.life.enter(&e.boxExecs)
	if !shutting {
		defer e.boxExecs.Done()
	}
	b := r.backends.current()
	r.counters.execs.Add(1)
	if deleting || b == nil {
		return ExecResult{}, false, boxerr.SessionNotFound(spec.SessionID).With("reason", "being deleted")
	}
	if shutting {
		// Close stops the execs registered before it began (Execs.stopAll);
		// one that got here later must not start.
		return ExecResult{}, false, errShuttingDown()
	}
	if !opts.live() {
		res, gone, err := e.run(ctx, spec, b, info, nil)
		if res.Restarted {
			r.sessions.markRestarted(s)
		}
		return res, gone, err
	}
	x, xctx := newLiveExec(ctx, s, spec, opts, false, e.outputLimit(spec), r.clock.Now())
	e.table.add(x)
	var followed <-chan struct{}
	if opts.Sink != nil {
		_, followed = x.follow(0, opts.Sink)
	}
	res, gone, err := e.run(xctx, spec, b, info, x)
	if res.Restarted {
		r.sessions.markRestarted(s)
	}
	if followed != nil {
		<-followed // every chunk is out before the result
	}
	e.finish(x, res, err)
	return res, gone, err
}

// run runs one command through the backend: with x, a live exec's
// streams and controls, else plain head+tail buffers (outputLimit).
func (e *Execs) run(ctx context.Context, spec Spec, b backends.Backend, info backends.Session, x *liveExec) (_ ExecResult, gone bool, _ error) {
	req := backends.ExecRequest{
		Cmd:     spec.Cmd,
		NoLogin: spec.NoLogin,
		Workdir: spec.Workdir,
		Env:     spec.Env,
		Timeout: time.Duration(spec.TimeoutSec) * time.Second,
	}
	var stdout, stderr *lockedHeadTail
	if x != nil {
		x.wire(&req)
		stdout, stderr = x.stdout, x.stderr
	} else {
		limit := e.outputLimit(spec)
		stdout, stderr = &lockedHeadTail{h: newHeadTail(limit)}, &lockedHeadTail{h: newHeadTail(limit)}
		req.Stdout, req.Stderr = stdout, stderr
	}
	start := time.Now()
	status, err := b.Exec(ctx, info, req)
	if x != nil {
		x.endOutput()
		if x.stdinR != nil {
			// The backend closes it too; this ends a stdin write still
			// waiting even if a backend forgot.
			x.stdinR.Close()
		}
	}
	if errors.Is(context.Cause(ctx), errDeleted) {
		return ExecResult{}, false, boxerr.SessionNotFound(spec.SessionID).With("reason", "deleted").Wrap(errDeleted)
	}
	// A cancelled context is a host stopping the command (its request was
	// cancelled, box_exec_kill, its connection went): the tree is killed
	// and the answer says so, with what the command printed until then.
	canceled := ctx.Err() != nil
	if err != nil && !canceled {
		return ExecResult{}, ctx.Err() == nil && !b.Alive(ctx, info), err
	}
	if !canceled {
		e.r.publishExec(spec.SessionID, spec, status)
	}
	res := ExecResult{
		SessionID:   spec.SessionID,
		BackendName: b.Name(),
		Status:      StatusCompleted,
		DurationMS:  time.Since(start).Milliseconds(),
	}
	res.Restarted = status.Restarted
	res.Stdout, res.StdoutTruncated, res.StdoutBytes = stdout.snapshot()
	res.Stderr, res.StderrTruncated, res.StderrBytes = stderr.snapshot()
	if res.StdoutTruncated || res.StderrTruncated {
		e.r.counters.truncated.Add(1)
	}
	switch {
	case canceled:
		res.Status = StatusCanceled
	case status.TimedOut:
		res.Status = StatusTimedOut
		if res.Stderr == "" {
			res.Stderr = "Command timed out after " + strconv.Itoa(spec.TimeoutSec) + " seconds."
		}
		e.r.counters.timeouts.Add(1)
	default:
		code := status.ExitCode
		res.ExitCode = &code
	}
	return res, false, nil
}

// outputLimit is what an exec keeps of each stream.
func (e *Execs) outputLimit(spec Spec) int {
	if spec.MaxOutputBytes > 0 {
		return spec.MaxOutputBytes
	}
	return e.r.Config().Limits.MaxOutputBytes
}
