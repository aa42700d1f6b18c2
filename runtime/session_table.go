package runtime

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/keyed"
)

// session is one entry of the table. Its fields up to deleted are guarded
// by the table's lock. execMu serialises the session's box_execs (the
// reference's per-session order); op serialises process starts/stops and
// destruction. Destruction takes both, after cancelling the running
// box_exec through cancelExec when it was asked to interrupt.
type session struct {
	info        backends.Session
	cancelExec  context.CancelCauseFunc
	activeExecs int
	deleting    bool
	// interrupted: a delete is on its way (it may still wait for the id
	// lock, held by a recreate that waits for the running exec). The
	// running exec was cancelled and no further exec starts, so neither
	// the recreate nor the delete waits for a command to end.
	interrupted bool
	// resumeProcs are the managed processes to start again when a
	// suspended session resumes.
	resumeProcs []backends.ProcessSpec
	// skills are the skill mounts the session has accumulated; they are
	// kept apart from info.ExtraMounts so they never count as a change of
	// the caller's extra mounts.
	skills []backends.MountSpec

	deleted chan struct{} // closed once destroyed
	execMu  sync.Mutex
	op      sync.Mutex
}

func newSession(info backends.Session) *session {
	return &session{info: info, deleted: make(chan struct{})}
}

// sandboxInfo is the session as backends see it: the caller's extra mounts
// plus the skill mounts. The table's lock is held.
func (s *session) sandboxInfo() backends.Session {
	info := s.info
	if len(s.skills) > 0 {
		info.ExtraMounts = append(slices.Clone(info.ExtraMounts), s.skills...)
	}
	return info
}

// sessionTable is the sessions by physical id. Its lock guards the map,
// the reservations and the state of every session in it; the per-id locks
// serialise what makes, remakes, suspends, resumes, exports or destroys
// one session. It counts the sessions it adds and removes in the same
// step, so box_status never sees one without the other.
type sessionTable struct {
	clock    Clock
	counters *counters
	ids      keyed.Locks

	mu   sync.Mutex
	byID map[string]*session
	// creating and closing count the sessions being made and being
	// destroyed: both hold a place under max_sessions, and creating keeps
	// a box_init from replacing the backend.
	creating int
	closing  int
}

func newSessionTable(clock Clock, c *counters) *sessionTable {
	return &sessionTable{clock: clock, counters: c, byID: map[string]*session{}}
}

// underID runs fn holding id's lock.
func (t *sessionTable) underID(id string, fn func()) {
	unlock := t.ids.Lock(id)
	defer unlock()
	fn()
}

// underLive runs fn on id's live session holding id's lock: suspend,
// resume and a snapshot's export keep out of each other.
func (t *sessionTable) underLive(id string, fn func(*session) error) error {
	unlock := t.ids.Lock(id)
	defer unlock()
	s, err := t.live(id)
	if err != nil {
		return err
	}
	return fn(s)
}

func (t *sessionTable) get(id string) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

// live is session id, refused as not found when it is missing or being
// deleted.
func (t *sessionTable) live(id string) (*session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.byID[id]
	if !ok || s.deleting {
		return nil, boxerr.SessionNotFound(id)
	}
	return s, nil
}

// lookup is id's session (nil when there is none), or the channel that is
// closed when its deletion under way ends.
func (t *sessionTable) lookup(id string) (*session, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byID[id]
	if s != nil && s.deleting {
		return nil, s.deleted
	}
	return s, nil
}

func (t *sessionTable) info(s *session) backends.Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.info
}

// state is s's info and skill mounts.
func (t *sessionTable) state(s *session) (backends.Session, []backends.MountSpec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.info, s.skills
}

func (t *sessionTable) sandboxInfo(s *session) backends.Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.sandboxInfo()
}

// markRestarted records that s's sandbox was restarted (its info then
// says so until the session is made afresh or resumed).
func (t *sessionTable) markRestarted(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.info.Restarted = true
}

func (t *sessionTable) isDeleting(s *session) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.deleting
}

// inUse reports a session in the table or one being made.
func (t *sessionTable) inUse() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID) > 0 || t.creating > 0
}

// census is the number of sessions with the counters as of that number.
func (t *sessionTable) census() (int, Counters) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID), t.counters.snapshot()
}

// list returns the sessions whose physical id matches, oldest first.
func (t *sessionTable) list(match func(id string) bool) []SessionInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]SessionInfo, 0, len(t.byID))
	for id, s := range t.byID {
		if match(id) {
			out = append(out, SessionInfo{s.info})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// interruptWhere interrupts (as interrupt does) the sessions that match,
// all in one step, and returns them with their infos.
func (t *sessionTable) interruptWhere(match func(*session) bool) ([]*session, []backends.Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ss []*session
	var infos []backends.Session
	for _, s := range t.byID {
		if match(s) {
			t.interruptLocked(s)
			ss = append(ss, s)
			infos = append(infos, s.info)
		}
	}
	return ss, infos
}

// touch marks a session used now (relay traffic counts as activity).
func (t *sessionTable) touch(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.byID[id]; ok {
		s.info.LastUsedAt = t.clock.Now()
	}
}

// usedAt records a use of s at a time another replica reported.
func (t *sessionTable) usedAt(s *session, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if at.After(s.info.LastUsedAt) {
		s.info.LastUsedAt = at
	}
}

// reserve holds a place under limit for a session about to be made.
func (t *sessionTable) reserve(limit int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.byID)+t.creating+t.closing >= limit {
		return boxerr.CapacityExceeded("max_sessions", limit, "Box session capacity reached (%d)", limit)
	}
	t.creating++
	return nil
}

func (t *sessionTable) unreserve() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.creating--
}

// insertCreated turns a reservation into the session made for spec.
func (t *sessionTable) insertCreated(spec Spec, info backends.Session, skills []backends.MountSpec, forExec bool) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.creating--
	now := t.clock.Now()
	info.SessionID = spec.SessionID
	info.CreatedAt, info.LastUsedAt = now, now
	info.ExtraMounts = spec.ActiveExtraMounts()
	s := newSession(info)
	s.skills = skills
	if forExec {
		s.activeExecs++
	}
	t.byID[spec.SessionID] = s
	t.counters.created.Add(1)
	return s
}

// reuse marks s used again with skills; with forExec it is marked as
// running an exec, so the reaper spares it from now on.
func (t *sessionTable) reuse(s *session, skills []backends.MountSpec, forExec bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.skills = skills
	s.info.LastUsedAt = t.clock.Now()
	t.counters.reused.Add(1)
	if forExec {
		s.activeExecs++
	}
}

// adopt puts sandboxes found on the backend into the table; it returns
// the ones whose session id the table already serves with another
// sandbox.
func (t *sessionTable) adopt(infos []backends.Session, resumeProcs func(backends.Session) []backends.ProcessSpec) (adopted, duplicates []backends.Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	for _, info := range infos {
		if s, exists := t.byID[info.SessionID]; exists {
			if s.info.BackendSessionID != info.BackendSessionID {
				duplicates = append(duplicates, info)
			}
			continue
		}
		info.LastUsedAt = now
		if info.CreatedAt.IsZero() {
			info.CreatedAt = now
		}
		var skills []backends.MountSpec
		info.ExtraMounts, skills = splitSkillMounts(info)
		s := newSession(info)
		s.skills = skills
		if info.State == backends.StateSuspended {
			s.resumeProcs = resumeProcs(info)
		}
		t.byID[info.SessionID] = s
		adopted = append(adopted, info)
	}
	return adopted, duplicates
}

// interrupt cancels the running box_exec of session id and refuses its
// later ones, as it is about to be deleted.
func (t *sessionTable) interrupt(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.byID[id]; ok {
		t.interruptLocked(s)
	}
}

func (t *sessionTable) interruptLocked(s *session) {
	s.interrupted = true
	if s.cancelExec != nil {
		s.cancelExec(errDeleted)
	}
}

// beginDestroy marks s as being deleted; first is false when a deletion
// is under way already (wait for s.deleted then).
func (t *sessionTable) beginDestroy(s *session, interrupt bool) (first bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if interrupt {
		t.interruptLocked(s)
	}
	if s.deleting {
		return false
	}
	s.deleting = true
	t.closing++
	return true
}

// remove ends s's deletion: it leaves the table (unless a new session of
// the same id replaced it) and is counted, reaped with reasonTTL.
func (t *sessionTable) remove(s *session, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closing--
	if t.byID[s.info.SessionID] == s {
		delete(t.byID, s.info.SessionID)
	}
	t.counters.cleaned.Add(1)
	if reason == reasonTTL {
		t.counters.reaped.Add(1)
	}
}

// startBoxExec registers cancel as the way to interrupt s's box_exec and
// returns the sandbox to run it in; gone when s is being deleted. Both
// happen in one step, so a delete either sees cancel or is seen here.
func (t *sessionTable) startBoxExec(s *session, cancel context.CancelCauseFunc) (_ backends.Session, gone bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.cancelExec = cancel
	return s.sandboxInfo(), s.deleting || s.interrupted
}

func (t *sessionTable) endBoxExec(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.cancelExec = nil
}

// execTarget is the sandbox an exec of s runs in; gone when s is being
// deleted.
func (t *sessionTable) execTarget(s *session) (_ backends.Session, gone bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.sandboxInfo(), s.deleting || s.interrupted
}

// releaseExec undoes an exec mark (acquire's forExec, a file call's busy).
func (t *sessionTable) releaseExec(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.activeExecs--
	s.info.LastUsedAt = t.clock.Now()
}

// markBusy marks s as running a call so the reaper and suspend spare it,
// unless it is suspended (resume it, then ask again) or being deleted.
func (t *sessionTable) markBusy(s *session) (_ backends.Session, suspended bool, _ error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.deleting {
		return backends.Session{}, false, boxerr.SessionNotFound(s.info.SessionID).With("reason", "being deleted")
	}
	if s.info.State == backends.StateSuspended {
		return backends.Session{}, true, nil
	}
	s.activeExecs++
	s.info.LastUsedAt = t.clock.Now()
	return s.sandboxInfo(), false, nil
}

// busy reports a call running in s.
func (t *sessionTable) busy(s *session) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.activeExecs > 0
}

// cancelBoxExecs cancels every running box_exec (at exit).
func (t *sessionTable) cancelBoxExecs(cause error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.byID {
		if s.cancelExec != nil {
			s.cancelExec(cause)
		}
	}
}

// suspended records that s was suspended with specs running.
func (t *sessionTable) suspended(s *session, specs []backends.ProcessSpec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.info.State = backends.StateSuspended
	s.resumeProcs = specs
	t.counters.suspended.Add(1)
}

// toResume is what resuming s needs; ok is false when s is not suspended.
func (t *sessionTable) toResume(s *session) (info backends.Session, specs []backends.ProcessSpec, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.info, s.resumeProcs, s.info.State == backends.StateSuspended
}

func (t *sessionTable) resumed(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.info.State = backends.StateRunning
	s.info.Restarted = false // a resume starts the processes afresh, as asked
	s.info.LastUsedAt = t.clock.Now()
	s.resumeProcs = nil
	t.counters.resumed.Add(1)
}

// current is s's info while s is still id's session and not being
// deleted.
func (t *sessionTable) current(id string, s *session) (_ backends.Session, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.info, t.byID[id] == s && !s.deleting && !s.interrupted
}

// idle returns the sessions the reaper may act on, as far as the table
// knows (no exec, not suspended or being deleted, unused since cutoff).
func (t *sessionTable) idle(cutoff time.Time) []*session {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*session
	for _, s := range t.byID {
		if t.idleLocked(s, cutoff) {
			out = append(out, s)
		}
	}
	return out
}

// stillIdle re-checks a reaper candidate.
func (t *sessionTable) stillIdle(s *session, cutoff time.Time) (backends.Session, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.info, t.byID[s.info.SessionID] == s && t.idleLocked(s, cutoff)
}

func (t *sessionTable) idleLocked(s *session, cutoff time.Time) bool {
	return !s.deleting && s.activeExecs == 0 && s.info.State != backends.StateSuspended && s.info.LastUsedAt.Before(cutoff)
}

// reconcileEntry is a session as Reconcile checked it.
type reconcileEntry struct {
	s         *session
	info      backends.Session // s.sandboxInfo() when checked
	backendID string
	suspended bool
	sessionID string
}

// checkable returns the sessions Reconcile asks the backend about.
func (t *sessionTable) checkable() []reconcileEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []reconcileEntry
	for id, s := range t.byID {
		if !s.deleting && s.info.State != backends.StateLost {
			out = append(out, reconcileEntry{s: s, info: s.sandboxInfo(), backendID: s.info.BackendSessionID,
				suspended: s.info.State == backends.StateSuspended, sessionID: id})
		}
	}
	return out
}

// markLost marks the entries lost whose session is still the very sandbox
// checked (one recreated, deleted or suspended meanwhile is another
// story); it returns those it marked.
func (t *sessionTable) markLost(entries []reconcileEntry) []reconcileEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	var marked []reconcileEntry
	for _, e := range entries {
		if t.byID[e.sessionID] != e.s || e.s.deleting || e.s.info.BackendSessionID != e.backendID ||
			(e.s.info.State == backends.StateSuspended) != e.suspended {
			continue
		}
		e.s.info.State = backends.StateLost
		marked = append(marked, e)
	}
	return marked
}
