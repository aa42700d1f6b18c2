package runtime

import (
	"context"
	"strconv"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// Exec runs spec.Cmd in the session spec.SessionID (created or reused as
// EnsureSession does). A timeout kills the command's process tree and keeps
// the session; its files and state survive.
func (r *Runtime) Exec(ctx context.Context, spec backends.Spec) (backends.ExecResult, error) {
	if spec.Cmd == "" {
		return backends.ExecResult{}, backends.Validation("cmd", "cmd must not be empty")
	}
	s, err := r.acquire(ctx, spec, true)
	if err != nil {
		return backends.ExecResult{}, err
	}
	defer func() {
		r.mu.Lock()
		s.activeExecs--
		s.info.LastUsedAt = r.clock.Now()
		r.mu.Unlock()
	}()

	s.op.Lock()
	defer s.op.Unlock()
	r.mu.Lock()
	deleting, info, b := s.deleting, s.info, r.backend
	limit := r.cfg.Limits.MaxOutputBytes
	r.counters.TotalExecs++
	r.mu.Unlock()
	if deleting || b == nil {
		return backends.ExecResult{}, backends.SessionNotFound(spec.SessionID).With("reason", "being deleted")
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
	if err != nil {
		return backends.ExecResult{}, err
	}
	res := backends.ExecResult{
		SessionID:       spec.SessionID,
		BackendName:     b.Name(),
		Status:          backends.StatusCompleted,
		Stdout:          stdout.String(),
		Stderr:          stderr.String(),
		DurationMS:      time.Since(start).Milliseconds(),
		StdoutTruncated: stdout.Truncated(),
		StderrTruncated: stderr.Truncated(),
		StdoutBytes:     stdout.total,
		StderrBytes:     stderr.total,
	}
	if status.TimedOut {
		res.Status = backends.StatusTimedOut
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
	return res, nil
}
