package runtime

import (
	"context"
	"time"

	"github.com/boxrt/boxrt/backends"
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

// suspendRecords keeps the suspend records in <state dir>/suspended/.
type suspendRecords struct{ sessionRecords }

func (rs suspendRecords) write(rec suspendRecord) error {
	return rs.sessionRecords.write(rec.SessionID, rec)
}

// read returns the processes recorded for an adopted suspended session; a
// missing or foreign record (another sandbox of the same id) means none.
func (rs suspendRecords) read(info backends.Session) []backends.ProcessSpec {
	var rec suspendRecord
	if !rs.load(info.SessionID, &rec) || rec.SessionID != info.SessionID || rec.BackendSessionID != info.BackendSessionID {
		return nil
	}
	return rec.Processes
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
	id, err := resolve(ctx, id)
	if err != nil {
		return SessionInfo{}, err
	}
	b, err := r.backends.ensure(ctx)
	if err != nil {
		return SessionInfo{}, err
	}
	var info backends.Session
	err = r.sessions.underLive(id, func(s *session) error {
		if r.sessions.info(s).State != backends.StateSuspended {
			if r.sessions.busy(s) {
				return boxerr.Failure("session %s has a command running; suspend it once the command ends", id).
					With("session_id", id).With("reason", "busy")
			}
			if err := r.suspend(ctx, b, s, "explicit"); err != nil {
				return err
			}
		}
		info = r.sessions.info(s)
		return nil
	})
	return SessionInfo{info}, err
}

// suspend suspends s; the caller holds s's id lock and has checked that
// no exec runs.
func (r *Runtime) suspend(ctx context.Context, b backends.Backend, s *session, reason string) error {
	sp, err := suspender(b)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	s.op.Lock()
	defer s.op.Unlock()
	info := r.sessions.info(s)
	if sc, ok := b.(backends.SuspendChecker); ok && !sc.CanSuspend(info) {
		// Refused before anything is stopped: the session keeps running
		// as it was.
		return boxerr.Failure("the %s backend cannot suspend session %s: its files would not survive (only persistent sessions can be suspended there)", b.Name(), info.SessionID).
			With("session_id", info.SessionID).With("reason", "not_persistent")
	}
	specs := r.procs.table.runningSpecs(s)
	// The record goes first: a crash after the backend's mark must still
	// find the processes to bring back.
	if err := r.records.write(suspendRecord{SessionID: info.SessionID, BackendSessionID: info.BackendSessionID,
		SuspendedAt: r.clock.Now().UTC(), Processes: specs}); err != nil {
		return backends.StateDirError("suspend session "+info.SessionID+": writing its record", err)
	}
	r.procs.stopSession(ctx, s)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = sp.Suspend(sctx, info)
	cancel()
	if err != nil {
		r.records.drop(info.SessionID)
		return err
	}
	r.sessions.suspended(s, specs)
	r.events.publish(info.SessionID, EventSuspended, map[string]any{"reason": reason})
	r.log.Info().Str("session_id", info.SessionID).Str("reason", reason).Int("processes", len(specs)).Msg("session suspended")
	return nil
}

// ResumeSession resumes a suspended session (a running one is returned as
// it is).
func (r *Runtime) ResumeSession(ctx context.Context, id string) (SessionInfo, error) {
	physical, err := resolve(ctx, id)
	if err != nil {
		return SessionInfo{}, err
	}
	return r.resumeSession(ctx, physical)
}

// resumeSession is ResumeSession of a physical id.
func (r *Runtime) resumeSession(ctx context.Context, id string) (SessionInfo, error) {
	b, err := r.backends.ensure(ctx)
	if err != nil {
		return SessionInfo{}, err
	}
	var info backends.Session
	err = r.sessions.underLive(id, func(s *session) error {
		if err := r.resume(ctx, b, s); err != nil {
			return err
		}
		info = r.sessions.info(s)
		return nil
	})
	return SessionInfo{info}, err
}

// Acquire resumes session id when it is suspended and marks it used; other
// runtime parts (file access) call it before touching a session's files.
func (r *Runtime) Acquire(ctx context.Context, id string) error {
	id, err := resolve(ctx, id)
	if err != nil {
		return err
	}
	if _, err := r.resumeSession(ctx, id); err != nil {
		return err
	}
	r.sessions.touch(id)
	return nil
}

// resume resumes s when it is suspended; the caller holds s's id lock, so
// concurrent callers resume it once. Managed processes that ran at
// suspension are started again, flagged as resumed (their earlier output
// is gone).
func (r *Runtime) resume(ctx context.Context, b backends.Backend, s *session) error {
	info, specs, suspended := r.sessions.toResume(s)
	if !suspended {
		return nil
	}
	// Close keeps suspended sessions as they are, and must see this one
	// running, or suspended.
	if !r.life.enter(&r.inflight) {
		return errShuttingDown()
	}
	defer r.inflight.Done()
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
	r.sessions.resumed(s)
	r.events.publish(info.SessionID, EventResumed, nil)
	r.records.drop(info.SessionID)
	s.op.Lock()
	defer s.op.Unlock()
	for _, spec := range specs {
		if _, err := r.procs.start(ctx, b, s, spec, true); err != nil {
			r.log.Warn().Err(err).Str("session_id", info.SessionID).Str("process_id", spec.ProcessID).Msg("managed process did not come back after resume")
		}
	}
	r.log.Info().Str("session_id", info.SessionID).Int("processes", len(specs)).Dur("took", time.Since(start)).Msg("session resumed")
	return nil
}
