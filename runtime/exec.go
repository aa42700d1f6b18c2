package runtime

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/clip"
	"github.com/boxrt/boxrt/runtime/boxerr"
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
func (r *Runtime) Exec(ctx context.Context, spec Spec) (ExecResult, error) {
	start := time.Now()
	res, err := r.exec(ctx, spec)
	ev := ExecEvent{SessionID: spec.SessionID, Backend: res.BackendName, Duration: time.Since(start), Status: res.Status,
		Truncated: res.StdoutTruncated || res.StderrTruncated}
	log := r.log.Info()
	if err != nil {
		ev.ErrType = ErrorType(err)
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
	return res, err
}

// ErrorType is the wire type name of err ("BoxError" for untyped errors).
func ErrorType(err error) string {
	var be *boxerr.Error
	if errors.As(err, &be) {
		return be.Type()
	}
	return boxerr.ErrBox.Error()
}

func (r *Runtime) exec(ctx context.Context, spec Spec) (ExecResult, error) {
	if spec.Cmd == "" {
		return ExecResult{}, boxerr.Validation("cmd", "cmd must not be empty")
	}
	for attempt := 0; ; attempt++ {
		s, err := r.acquire(ctx, spec, true)
		if err != nil {
			return ExecResult{}, err
		}
		res, gone, err := r.execIn(ctx, s, spec)
		if !gone || attempt > 0 {
			return res, err
		}
		// Reuse does not probe liveness before an exec (it costs an engine
		// round trip per call); an exec that fails on a sandbox that turns
		// out to be gone recreates the session once and runs there.
		r.log.Warn().Str("session_id", spec.SessionID).Err(err).Msg("sandbox is gone; recreating the session")
		if derr := r.destroy(ctx, s, "sandbox is gone", false); derr != nil {
			return res, err
		}
		r.mu.Lock()
		r.counters.TotalRecreated++
		r.mu.Unlock()
	}
}

// execIn runs spec.Cmd in s. gone reports a failure whose cause is that
// the sandbox no longer exists.
func (r *Runtime) execIn(ctx context.Context, s *session, spec Spec) (_ ExecResult, gone bool, _ error) {
	defer func() {
		r.mu.Lock()
		s.activeExecs--
		s.info.LastUsedAt = r.clock.Now()
		r.mu.Unlock()
	}()

	s.execMu.Lock()
	defer s.execMu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.mu.Lock()
	deleting, info, b := s.deleting, s.sandboxInfo(), r.backend
	limit := r.cfg.Limits.MaxOutputBytes
	r.counters.TotalExecs++
	s.cancelExec = cancel
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		s.cancelExec = nil
		r.mu.Unlock()
	}()
	if deleting || b == nil {
		return ExecResult{}, false, boxerr.SessionNotFound(spec.SessionID).With("reason", "being deleted")
	}
	if spec.MaxOutputBytes > 0 {
		limit = spec.MaxOutputBytes
	}
	stdout, stderr := newHeadTail(limit), newHeadTail(limit)
	start := time.Now()
	status, err := b.Exec(ctx, info, backends.ExecRequest{
		Cmd:     spec.Cmd,
		Workdir: spec.Workdir,
		Env:     spec.Env,
		Timeout: time.Duration(spec.TimeoutSec) * time.Second,
		Stdout:  stdout,
		Stderr:  stderr,
	})
	if errors.Is(context.Cause(ctx), errDeleted) {
		return ExecResult{}, false, boxerr.SessionNotFound(spec.SessionID).With("reason", "deleted").Wrap(errDeleted)
	}
	if err != nil {
		return ExecResult{}, ctx.Err() == nil && !b.Alive(ctx, info), err
	}
	res := ExecResult{
		SessionID:       spec.SessionID,
		BackendName:     b.Name(),
		Status:          StatusCompleted,
		Stdout:          stdout.String(),
		Stderr:          stderr.String(),
		DurationMS:      time.Since(start).Milliseconds(),
		StdoutTruncated: stdout.Truncated(),
		StderrTruncated: stderr.Truncated(),
		StdoutBytes:     stdout.total,
		StderrBytes:     stderr.total,
	}
	if res.StdoutTruncated || res.StderrTruncated {
		r.mu.Lock()
		r.counters.TotalTruncated++
		r.mu.Unlock()
	}
	if status.TimedOut {
		res.Status = StatusTimedOut
		if res.Stderr == "" {
			res.Stderr = "Command timed out after " + strconv.Itoa(spec.TimeoutSec) + " seconds."
		}
		r.mu.Lock()
		r.counters.TotalTimeouts++
		r.mu.Unlock()
	} else {
		code := status.ExitCode
		res.ExitCode = &code
	}
	return res, false, nil
}
