package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/atomicfile"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Idle policies (durable.idle_policy): what the reaper does with a session
// idle for longer than limits.session_ttl_sec.
const (
	// IdleAuto suspends persistent sessions (their workspace is meant to
	// outlive idleness) and destroys the others, on backends that can
	// suspend; elsewhere it keeps persistent ones running, as before.
	IdleAuto = "auto"
	// IdleSuspend suspends every idle session.
	IdleSuspend = "suspend"
	// IdleDestroy destroys idle non-persistent sessions and never touches
	// persistent ones (boxrt's behaviour before suspension existed).
	IdleDestroy = "destroy"
)

// suspendRecord is what the runtime keeps of a suspended session beyond the
// backend's own mark: the managed processes to start again on resume. It
// lives in <state dir>/suspended/<sha256 of the session id>.json (0600:
// process env may hold secrets), written to a temp name and renamed.
type suspendRecord struct {
	SessionID        string                 `json:"session_id"`
	BackendSessionID string                 `json:"backend_session_id"`
	SuspendedAt      time.Time              `json:"suspended_at"`
	Processes        []backends.ProcessSpec `json:"processes"`
}

func (r *Runtime) suspendRecordPath(sessionID string) string {
	sum := sha256.Sum256([]byte(sessionID))
	return filepath.Join(r.stateDir, "suspended", hex.EncodeToString(sum[:])+".json")
}

func (r *Runtime) writeSuspendRecord(rec suspendRecord) error {
	path := r.suspendRecordPath(rec.SessionID)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}

// readSuspendRecord returns the record of an adopted suspended session; a
// missing or foreign one (another sandbox of the same id) means no
// processes.
func (r *Runtime) readSuspendRecord(info backends.Session) []backends.ProcessSpec {
	data, err := os.ReadFile(r.suspendRecordPath(info.SessionID))
	if err != nil {
		return nil
	}
	var rec suspendRecord
	if json.Unmarshal(data, &rec) != nil || rec.SessionID != info.SessionID || rec.BackendSessionID != info.BackendSessionID {
		return nil
	}
	return rec.Processes
}

func (r *Runtime) dropSuspendRecord(sessionID string) {
	if err := os.Remove(r.suspendRecordPath(sessionID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.log.Warn().Err(err).Str("session_id", sessionID).Msg("cannot remove suspend record")
	}
}

// suspender returns the backend's Suspender or a typed error naming it.
func suspender(b backends.Backend) (backends.Suspender, error) {
	sp, ok := b.(backends.Suspender)
	if !ok {
		return nil, boxerr.Failure("the %s backend cannot suspend sessions", b.Name()).With("backend", b.Name())
	}
	return sp, nil
}

// SuspendSession stops everything a session runs and keeps its files, spec
// and the specs of its running managed processes; the next call that needs
// it resumes it. A session with a command running is refused.
func (r *Runtime) SuspendSession(ctx context.Context, id string) (SessionInfo, error) {
	id, err := r.resolve(ctx, id)
	if err != nil {
		return SessionInfo{}, err
	}
	b, err := r.currentBackend(ctx)
	if err != nil {
		return SessionInfo{}, err
	}
	s, unlock, err := r.lockSession(id)
	if err != nil {
		return SessionInfo{}, err
	}
	defer unlock()
	if s.info.State == backends.StateSuspended {
		defer r.mu.Unlock()
		return SessionInfo{s.info}, nil
	}
	if s.activeExecs > 0 {
		r.mu.Unlock()
		return SessionInfo{}, boxerr.Failure("session %s has a command running; suspend it once the command ends", id).
			With("session_id", id).With("reason", "busy")
	}
	r.mu.Unlock()
	if err := r.suspendLocked(ctx, b, s, "explicit"); err != nil {
		return SessionInfo{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return SessionInfo{s.info}, nil
}

// suspendLocked suspends s; the caller holds s's id lock and has checked
// that no exec runs.
func (r *Runtime) suspendLocked(ctx context.Context, b backends.Backend, s *session, reason string) error {
	sp, err := suspender(b)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	s.op.Lock()
	defer s.op.Unlock()
	r.mu.Lock()
	info := s.info
	if sc, ok := b.(backends.SuspendChecker); ok && !sc.CanSuspend(info) {
		// Refused before anything is stopped: the session keeps running
		// as it was.
		r.mu.Unlock()
		return boxerr.Failure("the %s backend cannot suspend session %s: its files would not survive (only persistent sessions can be suspended there)", b.Name(), info.SessionID).
			With("session_id", info.SessionID).With("reason", "not_persistent")
	}
	var specs []backends.ProcessSpec
	for _, p := range s.procs {
		if p.running() {
			specs = append(specs, p.spec)
		}
	}
	r.mu.Unlock()
	// The record goes first: a crash after the backend's mark must still
	// find the processes to bring back.
	if err := r.writeSuspendRecord(suspendRecord{SessionID: info.SessionID, BackendSessionID: info.BackendSessionID,
		SuspendedAt: r.clock.Now().UTC(), Processes: specs}); err != nil {
		return backends.StateDirError("suspend session "+info.SessionID+": writing its record", err)
	}
	r.stopSessionProcesses(ctx, s)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = sp.Suspend(sctx, info)
	cancel()
	if err != nil {
		r.dropSuspendRecord(info.SessionID)
		return err
	}
	r.mu.Lock()
	s.info.State = backends.StateSuspended
	s.resumeProcs = specs
	r.counters.TotalSuspended++
	r.mu.Unlock()
	r.log.Info().Str("session_id", info.SessionID).Str("reason", reason).Int("processes", len(specs)).Msg("session suspended")
	return nil
}

// ResumeSession resumes a suspended session (a running one is returned as
// it is).
func (r *Runtime) ResumeSession(ctx context.Context, id string) (SessionInfo, error) {
	physical, err := r.resolve(ctx, id)
	if err != nil {
		return SessionInfo{}, err
	}
	return r.resumeSession(ctx, physical)
}

// resumeSession is ResumeSession of a physical id.
func (r *Runtime) resumeSession(ctx context.Context, id string) (SessionInfo, error) {
	b, err := r.currentBackend(ctx)
	if err != nil {
		return SessionInfo{}, err
	}
	s, unlock, err := r.lockSession(id)
	if err != nil {
		return SessionInfo{}, err
	}
	defer unlock()
	r.mu.Unlock()
	if err := r.resumeLocked(ctx, b, s); err != nil {
		return SessionInfo{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return SessionInfo{s.info}, nil
}

// Acquire resumes session id when it is suspended and marks it used; other
// runtime parts (file access) call it before touching a session's files.
func (r *Runtime) Acquire(ctx context.Context, id string) error {
	id, err := r.resolve(ctx, id)
	if err != nil {
		return err
	}
	if _, err := r.resumeSession(ctx, id); err != nil {
		return err
	}
	r.touch(id)
	return nil
}

// resumeLocked resumes s when it is suspended; the caller holds s's id
// lock, so concurrent callers resume it once. Managed processes that ran
// at suspension are started again, flagged as resumed (their earlier
// output is gone).
func (r *Runtime) resumeLocked(ctx context.Context, b backends.Backend, s *session) error {
	r.mu.Lock()
	if s.info.State != backends.StateSuspended {
		r.mu.Unlock()
		return nil
	}
	if r.shuttingDown {
		// Close keeps suspended sessions as they are.
		r.mu.Unlock()
		return errShuttingDown()
	}
	r.inflight.Add(1) // Close must see the session running, or suspended
	defer r.inflight.Done()
	info := s.info
	specs := s.resumeProcs
	r.mu.Unlock()
	sp, err := suspender(b)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = sp.Resume(sctx, info)
	cancel()
	if err != nil {
		return err
	}
	r.mu.Lock()
	s.info.State = backends.StateRunning
	s.info.LastUsedAt = r.clock.Now()
	s.resumeProcs = nil
	r.counters.TotalResumed++
	r.mu.Unlock()
	r.dropSuspendRecord(info.SessionID)
	s.op.Lock()
	defer s.op.Unlock()
	for _, spec := range specs {
		if _, err := r.startProcessOp(ctx, b, s, spec, true); err != nil {
			r.log.Warn().Err(err).Str("session_id", info.SessionID).Str("process_id", spec.ProcessID).Msg("managed process did not come back after resume")
		}
	}
	r.log.Info().Str("session_id", info.SessionID).Int("processes", len(specs)).Dur("took", time.Since(start)).Msg("session resumed")
	return nil
}
