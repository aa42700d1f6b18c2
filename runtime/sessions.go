package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// session is one entry of the table. info is guarded by Runtime.mu. execMu
// serialises the session's execs (the reference's per-session order); op
// serialises process starts/stops and destruction. Destruction takes both,
// after cancelling the running exec through cancelExec (guarded by
// Runtime.mu) when it was asked to interrupt.
type session struct {
	info        backends.Session
	execMu      sync.Mutex
	op          sync.Mutex
	cancelExec  context.CancelCauseFunc
	activeExecs int
	deleting    bool
	// interrupted: a delete is on its way (it may still wait for the id
	// lock, held by a recreate that waits for the running exec). The
	// running exec was cancelled and no further exec starts, so neither
	// the recreate nor the delete waits for a command to end.
	interrupted bool
	deleted     chan struct{}
	procs       map[string]*managedProcess
	// resumeProcs are the managed processes to start again when a
	// suspended session resumes.
	resumeProcs []backends.ProcessSpec
	// skills are the skill mounts the session has accumulated; they are
	// kept apart from info.ExtraMounts so they never count as a change of
	// the caller's extra mounts.
	skills []backends.MountSpec
}

func newSession(info backends.Session) *session {
	return &session{info: info, deleted: make(chan struct{}), procs: map[string]*managedProcess{}}
}

// sameMounts compares extra-mount sets, ignoring order and duplicates.
func sameMounts(a, b []backends.MountSpec) bool {
	key := func(ms []backends.MountSpec) []string {
		var out []string
		for _, m := range ms {
			if m.Mode != backends.MountNone {
				out = append(out, m.HostPath+"\x00"+m.MountPath+"\x00"+string(m.Mode))
			}
		}
		sort.Strings(out)
		return slices.Compact(out)
	}
	return slices.Equal(key(a), key(b))
}

// prepareSpec resolves host paths against the allow-list and fills the
// backend's default image.
func (r *Runtime) prepareSpec(b backends.Backend, spec Spec) (Spec, error) {
	// A backend that does not list the level cannot give it: refusing is
	// the only answer that never hands out weaker isolation than asked.
	if spec.Isolation != backends.IsolationDefault && !slices.Contains(b.Describe().IsolationLevels, spec.Isolation) {
		return spec, boxerr.Validation("isolation", "isolation %q is not offered by the %s backend here (offered: %v); "+
			"the operator enables gvisor with docker.gvisor_runtime", spec.Isolation, b.Name(), b.Describe().IsolationLevels).With("isolation", spec.Isolation)
	}
	roots, err := r.Config().mountRoots(r.stateDir)
	if err != nil {
		return spec, err
	}
	if spec.HostPath != "" && spec.HostPathMode != backends.MountNone {
		p, err := backends.ResolveHostPath("host_path", spec.HostPath, roots)
		if err != nil {
			return spec, err
		}
		spec.HostPath = p
	}
	mounts := make([]backends.MountSpec, 0, len(spec.ExtraMounts))
	for i, m := range spec.ExtraMounts {
		if m.Mode == backends.MountNone {
			continue
		}
		p, err := backends.ResolveHostPath(fmt.Sprintf("extra_mounts[%d].host_path", i), m.HostPath, roots)
		if err != nil {
			return spec, err
		}
		m.HostPath = p
		mounts = append(mounts, m)
	}
	spec.ExtraMounts = mounts
	if spec.Image == "" {
		spec.Image = b.DefaultImage()
	}
	// A path as the image (a bwrap rootfs directory) is a host path bound
	// into the sandbox like any other: it must pass the same allow-list.
	if strings.HasPrefix(spec.Image, "/") {
		p, err := backends.ResolveHostPath("image", spec.Image, roots)
		if err != nil {
			return spec, err
		}
		spec.Image = p
	}
	return spec, nil
}

// EnsureSession returns the session for spec.SessionID, creating it when
// missing, recreating it when its extra mounts changed or its sandbox died,
// and refusing with BoxSessionConflictError when it exists with another
// spec.
func (r *Runtime) EnsureSession(ctx context.Context, spec Spec) (SessionInfo, error) {
	c, err := r.CreateSession(ctx, spec)
	return c.SessionInfo, err
}

// CreatedSession is box_create_session's result: the session, and whether
// this call created it (first use, or its sandbox was found gone), so a
// host can tell a fresh workspace from the one it had.
type CreatedSession struct {
	SessionInfo
	SessionCreated bool
}

// MarshalJSON adds session_created to the session's own fields.
func (c CreatedSession) MarshalJSON() ([]byte, error) {
	return withField(c.SessionInfo, "session_created", c.SessionCreated)
}

// withField is v's JSON object with one more member.
func withField(v any, name string, value any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m[name], err = json.Marshal(value); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// CreateSession is EnsureSession that also says whether it created the
// session.
func (r *Runtime) CreateSession(ctx context.Context, spec Spec) (CreatedSession, error) {
	var err error
	if spec.SessionID, err = r.resolve(ctx, spec.SessionID); err != nil {
		return CreatedSession{}, err
	}
	s, created, err := r.acquire(ctx, spec, false)
	if err != nil {
		return CreatedSession{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return CreatedSession{SessionInfo: SessionInfo{s.info}, SessionCreated: created}, nil
}

// acquire is EnsureSession for a resolved spec.SessionID; with forExec the session is marked as running
// an exec before the per-id lock is released, so the reaper cannot take it.
// created reports that this call made the session's sandbox.
func (r *Runtime) acquire(ctx context.Context, spec Spec, forExec bool) (_ *session, created bool, _ error) {
	if err := checkPoolID(spec.SessionID); err != nil {
		return nil, false, err
	}
	for {
		b, err := r.currentBackend(ctx)
		if err != nil {
			return nil, false, err
		}
		ps := spec
		if ps.FromSnapshot != "" {
			if ps, err = r.fromSnapshot(ctx, b, ps); err != nil {
				return nil, false, err
			}
		}
		ps, err = r.prepareSpec(b, ps)
		if err != nil {
			return nil, false, err
		}
		skills, err := r.resolveSkills(ctx, ps)
		if err != nil {
			return nil, false, err
		}
		unlock := r.idLocks.Lock(ps.SessionID)
		s, created, wait, err := r.acquireLocked(ctx, b, ps, skills, forExec)
		unlock()
		if wait == nil {
			return s, created, err
		}
		// The id is being deleted, or box_init replaced the backend
		// while the spec was prepared for the old one: wait for that,
		// then start over.
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

func (r *Runtime) acquireLocked(ctx context.Context, b backends.Backend, spec Spec, skills []backends.MountSpec, forExec bool) (_ *session, created bool, wait chan struct{}, _ error) {
	live := b.Describe().SkillsLive
	r.mu.Lock()
	if r.shuttingDown {
		r.mu.Unlock()
		return nil, false, nil, errShuttingDown()
	}
	s := r.sessions[spec.SessionID]
	if s != nil && s.deleting {
		r.mu.Unlock()
		return nil, false, s.deleted, nil
	}
	if s != nil {
		if field, existing, requested := compatibility(s.info.Sandbox, spec.Sandbox); field != "" {
			r.mu.Unlock()
			return nil, false, nil, boxerr.SessionConflict(spec.SessionID, field, existing, requested)
		}
		info := s.info
		have := s.skills
		r.mu.Unlock()
		if info.State == backends.StateSuspended {
			if err := r.resumeLocked(ctx, b, s); err != nil {
				return nil, false, nil, err
			}
		}
		reason := ""
		if !sameMounts(info.ExtraMounts, spec.ExtraMounts) {
			reason = "extra mounts changed"
		}
		skills = mergeMounts(have, skills)
		if reason == "" && !live && !slices.Equal(have, skills) {
			reason = "skills changed (this backend cannot change mounts of a running sandbox)"
		}
		if reason == "" && info.State == backends.StateLost {
			reason = "sandbox is gone (found by Reconcile)"
		}
		// An exec finds a dead sandbox by failing (see Runtime.exec), so
		// only other callers pay for a liveness probe here.
		if reason == "" && !forExec && !b.Alive(ctx, info) {
			reason = "sandbox is gone"
		}
		if reason == "" {
			r.mu.Lock()
			s.skills = skills
			s.info.LastUsedAt = r.clock.Now()
			r.counters.TotalReused++
			if forExec {
				s.activeExecs++
			}
			r.mu.Unlock()
			return s, false, nil, nil
		}
		r.log.Info().Str("session_id", spec.SessionID).Str("reason", reason).Msg("recreating session")
		if err := r.destroy(ctx, s, "recreate", false); err != nil {
			return nil, false, nil, err
		}
		r.mu.Lock()
		r.counters.TotalRecreated++
	}
	// r.mu is held here; it was released during a recreate, so shutdown
	// and a backend swap are checked again.
	if r.shuttingDown {
		r.mu.Unlock()
		return nil, false, nil, errShuttingDown()
	}
	if r.backend != b {
		// box_init selected another backend since b was taken; a sandbox
		// made on b now would be one the runtime no longer reaches.
		r.mu.Unlock()
		return nil, false, closedChan, nil
	}
	limit := r.cfg.Limits.MaxSessions
	if len(r.sessions)+r.creating+r.closing >= limit {
		r.mu.Unlock()
		return nil, false, nil, boxerr.CapacityExceeded("max_sessions", limit, "Box session capacity reached (%d)", limit)
	}
	// creating > 0 also keeps a box_init from swapping the backend
	// (probeAndAdopt), and inflight makes Close wait for this creation.
	r.creating++
	r.inflight.Add(1)
	defer r.inflight.Done()
	r.mu.Unlock()

	// Creation outlives the request: a host that gives up must not leave a
	// half-made sandbox behind.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	startSpec := spec
	if !live {
		startSpec.ExtraMounts = append(slices.Clone(spec.ExtraMounts), skills...)
	}
	info, err := r.startSandbox(cctx, b, spec, startSpec.SandboxSpec)
	if err == nil && spec.restore != nil {
		if err = spec.restore(cctx, info); err != nil {
			_ = b.StopSession(context.WithoutCancel(ctx), info)
		}
	}
	cancel()

	r.mu.Lock()
	r.creating--
	if err != nil {
		r.mu.Unlock()
		return nil, false, nil, err
	}
	if r.shuttingDown {
		// Close is waiting for this creation (inflight) and has not
		// closed the backend yet: the sandbox goes before it does.
		r.mu.Unlock()
		_ = b.StopSession(context.WithoutCancel(ctx), info)
		return nil, false, nil, errShuttingDown()
	}
	now := r.clock.Now()
	info.SessionID = spec.SessionID
	info.CreatedAt, info.LastUsedAt = now, now
	info.ExtraMounts = spec.ActiveExtraMounts()
	s = newSession(info)
	s.skills = skills
	if forExec {
		s.activeExecs++
	}
	r.sessions[spec.SessionID] = s
	r.counters.TotalCreated++
	r.mu.Unlock()
	r.log.Info().Str("session_id", spec.SessionID).Str("backend", info.BackendName).
		Str("backend_session_id", info.BackendSessionID).Msg("session created")
	return s, true, nil, nil
}

// SessionDetails is box_get_session's result: the session plus its managed
// processes.
type SessionDetails struct {
	SessionInfo
	ManagedProcesses map[string]ProcessInfo `json:"managed_processes,omitempty"`
	ManagedProcess   *ProcessInfo           `json:"managed_process,omitempty"`
}

// MarshalJSON flattens the session info and adds the process fields; the
// embedded SessionInfo's own MarshalJSON would otherwise drop them.
func (d SessionDetails) MarshalJSON() ([]byte, error) {
	raw, err := json.Marshal(d.SessionInfo)
	if err != nil {
		return nil, err
	}
	if d.ManagedProcesses == nil {
		return raw, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m["managed_processes"], err = json.Marshal(d.ManagedProcesses); err != nil {
		return nil, err
	}
	if d.ManagedProcess != nil {
		if m["managed_process"], err = json.Marshal(d.ManagedProcess); err != nil {
			return nil, err
		}
	}
	return json.Marshal(m)
}

// GetSession returns one session of ctx's namespace.
func (r *Runtime) GetSession(ctx context.Context, id string) (SessionDetails, error) {
	physical, err := r.resolve(ctx, id)
	if err != nil {
		return SessionDetails{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sessions[physical]
	if !ok {
		return SessionDetails{}, boxerr.SessionNotFound(id)
	}
	d := SessionDetails{SessionInfo: SessionInfo{s.info}}
	if len(s.procs) > 0 {
		d.ManagedProcesses = map[string]ProcessInfo{}
		for pid, p := range s.procs {
			d.ManagedProcesses[pid] = p.info()
		}
		if p, ok := d.ManagedProcesses[DefaultProcessID]; ok {
			d.ManagedProcess = &p
		}
	}
	return d, nil
}

// ListSessions returns the sessions of ctx's namespace, oldest first.
func (r *Runtime) ListSessions(ctx context.Context) []SessionInfo {
	return r.sessionsWhere(func(id string) bool { return tenant.Visible(ctx, id) })
}

// sessionsWhere returns the sessions whose physical id matches, oldest
// first.
func (r *Runtime) sessionsWhere(match func(id string) bool) []SessionInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]SessionInfo, 0, len(r.sessions))
	for id, s := range r.sessions {
		if match(id) {
			out = append(out, SessionInfo{s.info})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// liveSessionLocked is session id, refused as not found when it is missing
// or being deleted; the caller holds r.mu.
func (r *Runtime) liveSessionLocked(id string) (*session, error) {
	s, ok := r.sessions[id]
	if !ok || s.deleting {
		return nil, boxerr.SessionNotFound(id)
	}
	return s, nil
}

// lockSession takes id's lock (suspend, resume and a snapshot's export keep
// out of each other) and finds its live session. It returns with r.mu held
// as well, so the caller checks the session's state before anything
// changes it; on error it holds neither.
func (r *Runtime) lockSession(id string) (s *session, unlock func(), err error) {
	unlock = r.idLocks.Lock(id)
	r.mu.Lock()
	if s, err = r.liveSessionLocked(id); err != nil {
		r.mu.Unlock()
		unlock()
		return nil, nil, err
	}
	return s, unlock, nil
}

// DeleteSession stops the session's processes and destroys its sandbox. A
// running exec is killed first (its caller gets BoxSessionNotFoundError);
// a delete never waits for a long command to finish on its own, not even
// when a recreate of the session (which holds the id lock) waits for it.
func (r *Runtime) DeleteSession(ctx context.Context, id string) error {
	physical, err := r.resolve(ctx, id)
	if err != nil {
		return err
	}
	return r.deleteSession(ctx, physical)
}

// deleteSession is DeleteSession of a physical id.
func (r *Runtime) deleteSession(ctx context.Context, id string) error {
	r.mu.Lock()
	if s, ok := r.sessions[id]; ok {
		r.interruptLocked(s)
	}
	r.mu.Unlock()
	unlock := r.idLocks.Lock(id)
	defer unlock()
	r.mu.Lock()
	s, ok := r.sessions[id]
	r.mu.Unlock()
	if !ok {
		return boxerr.SessionNotFound(id)
	}
	return r.destroy(ctx, s, "delete", true)
}

// errDeleted is the cause an exec interrupted by its session's deletion
// sees.
var errDeleted = errors.New("session deleted while the command ran")

// closedChan is acquireLocked's "start over at once".
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func errShuttingDown() error { return boxerr.RuntimeUnavailable("Box runtime is shutting down") }

// interruptLocked cancels s's running exec and refuses its later ones, as
// s is about to be deleted. Runtime.mu is held.
func (r *Runtime) interruptLocked(s *session) {
	s.interrupted = true
	if s.cancelExec != nil {
		s.cancelExec(errDeleted)
	}
}

// destroy removes s from the table and its sandbox from the backend. With
// interrupt, a running exec is cancelled (its command tree killed by the
// backend) instead of waited for.
func (r *Runtime) destroy(ctx context.Context, s *session, reason string, interrupt bool) error {
	r.mu.Lock()
	if interrupt {
		r.interruptLocked(s)
	}
	if s.deleting {
		r.mu.Unlock()
		select {
		case <-s.deleted:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.deleting = true
	r.closing++
	b := r.backend
	r.mu.Unlock()
	r.stopSessionExecs(s) // background execs die with their sandbox

	ctx = context.WithoutCancel(ctx)
	s.execMu.Lock() // waits for the exec to end (killed when interrupting)
	defer s.execMu.Unlock()
	s.op.Lock() // waits for a process start or stop
	r.stopSessionProcesses(ctx, s)
	r.mu.Lock()
	info := s.info
	r.mu.Unlock()
	var err error
	if b != nil {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = b.StopSession(sctx, info)
		cancel()
	}
	if err == nil {
		r.dropSuspendRecord(info.SessionID)
	}
	s.op.Unlock()

	r.mu.Lock()
	r.closing--
	if r.sessions[s.info.SessionID] == s {
		delete(r.sessions, s.info.SessionID)
	}
	r.counters.TotalCleaned++
	if reason == reasonTTL {
		// Counted with the removal, so box_status never shows a reaped
		// session gone but not counted.
		r.counters.TotalReaped++
	}
	r.mu.Unlock()
	close(s.deleted)
	r.log.Info().Str("session_id", s.info.SessionID).Str("reason", reason).Err(err).Msg("session destroyed")
	if err != nil {
		return boxerr.Failure("destroy session %s: %v", s.info.SessionID, err).Wrap(err)
	}
	return nil
}
