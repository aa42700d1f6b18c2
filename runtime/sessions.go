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

// prepareSpec resolves host paths against the allow-list of cfg and fills
// the backend's default image.
func prepareSpec(b backends.Backend, spec Spec, cfg Config, stateDir string) (Spec, error) {
	// A backend that does not list the level cannot give it: refusing is
	// the only answer that never hands out weaker isolation than asked.
	if spec.Isolation != backends.IsolationDefault && !slices.Contains(b.Describe().IsolationLevels, spec.Isolation) {
		return spec, boxerr.Validation("isolation", "isolation %q is not offered by the %s backend here (offered: %v); "+
			"the operator enables gvisor with docker.gvisor_runtime", spec.Isolation, b.Name(), b.Describe().IsolationLevels).With("isolation", spec.Isolation)
	}
	// The roots resolve symlinks (a dozen system calls): only a spec with
	// a host path needs them, and most execs name none.
	roots := sync.OnceValues(func() ([]string, error) { return cfg.mountRoots(stateDir) })
	resolve := func(field, path string) (string, error) {
		r, err := roots()
		if err != nil {
			return "", err
		}
		return backends.ResolveHostPath(field, path, r)
	}
	var err error
	if spec.HostPath != "" && spec.HostPathMode != backends.MountNone {
		if spec.HostPath, err = resolve("host_path", spec.HostPath); err != nil {
			return spec, err
		}
	}
	mounts := make([]backends.MountSpec, 0, len(spec.ExtraMounts))
	for i, m := range spec.ExtraMounts {
		if m.Mode == backends.MountNone {
			continue
		}
		if m.HostPath, err = resolve(fmt.Sprintf("extra_mounts[%d].host_path", i), m.HostPath); err != nil {
			return spec, err
		}
		mounts = append(mounts, m)
	}
	spec.ExtraMounts = mounts
	if spec.Image == "" {
		spec.Image = b.DefaultImage()
	}
	// A path as the image (a bwrap rootfs directory) is a host path bound
	// into the sandbox like any other: it must pass the same allow-list.
	if strings.HasPrefix(spec.Image, "/") {
		if spec.Image, err = resolve("image", spec.Image); err != nil {
			return spec, err
		}
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
	if spec.SessionID, err = resolve(ctx, spec.SessionID); err != nil {
		return CreatedSession{}, err
	}
	s, created, err := r.acquire(ctx, spec, false)
	if err != nil {
		return CreatedSession{}, err
	}
	return CreatedSession{SessionInfo: SessionInfo{r.sessions.info(s)}, SessionCreated: created}, nil
}

// acquire is EnsureSession for a resolved spec.SessionID; with forExec the
// session is marked as running an exec before the per-id lock is released,
// so the reaper cannot take it. created reports that this call made the
// session's sandbox.
func (r *Runtime) acquire(ctx context.Context, spec Spec, forExec bool) (_ *session, created bool, _ error) {
	if err := checkPoolID(spec.SessionID); err != nil {
		return nil, false, err
	}
	for {
		b, err := r.backends.ensure(ctx)
		if err != nil {
			return nil, false, err
		}
		ps := spec
		if ps.FromSnapshot != "" {
			if ps, err = r.snapshots.restoreSpec(ctx, b, ps); err != nil {
				return nil, false, err
			}
		}
		ps, err = prepareSpec(b, ps, r.Config(), r.stateDir)
		if err != nil {
			return nil, false, err
		}
		skills, err := resolveSkills(ctx, r.skills, ps)
		if err != nil {
			return nil, false, err
		}
		var s *session
		var wait <-chan struct{}
		r.sessions.underID(ps.SessionID, func() {
			s, created, wait, err = r.getOrCreate(ctx, b, ps, skills, forExec)
		})
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

// getOrCreate reuses spec's session or makes it on b; the caller holds
// the id lock. A non-nil wait asks the caller to start over once it is
// closed.
func (r *Runtime) getOrCreate(ctx context.Context, b backends.Backend, spec Spec, skills []backends.MountSpec, forExec bool) (_ *session, created bool, wait <-chan struct{}, _ error) {
	if r.life.shuttingDown() {
		return nil, false, nil, errShuttingDown()
	}
	s, deleting := r.sessions.lookup(spec.SessionID)
	if deleting != nil {
		return nil, false, deleting, nil
	}
	if s != nil {
		var reused bool
		var err error
		if reused, skills, err = r.reuse(ctx, b, s, spec, skills, forExec); reused || err != nil {
			return s, false, nil, err
		}
	}
	return r.create(ctx, b, spec, skills, forExec)
}

// reuse serves spec with the existing session s, resumed when suspended;
// it refuses an incompatible spec, and destroys s (reused false) when it
// must be made again: its extra mounts or, on a backend that cannot
// change a running sandbox's mounts, its skills changed, or its sandbox
// is gone. merged is s's skill mounts with skills added: what a session
// made again has too.
func (r *Runtime) reuse(ctx context.Context, b backends.Backend, s *session, spec Spec, skills []backends.MountSpec, forExec bool) (reused bool, merged []backends.MountSpec, _ error) {
	info, have := r.sessions.state(s)
	if field, existing, requested := compatibility(info.Sandbox, spec.Sandbox); field != "" {
		return false, nil, boxerr.SessionConflict(spec.SessionID, field, existing, requested)
	}
	if info.State == backends.StateSuspended {
		if err := r.resume(ctx, b, s); err != nil {
			return false, nil, err
		}
	}
	skills = mergeMounts(have, skills)
	reason := ""
	switch {
	case !sameMounts(info.ExtraMounts, spec.ExtraMounts):
		reason = "extra mounts changed"
	case !b.Describe().SkillsLive && !slices.Equal(have, skills):
		reason = "skills changed (this backend cannot change mounts of a running sandbox)"
	case info.State == backends.StateLost:
		reason = "sandbox is gone (found by Reconcile)"
	// An exec finds a dead sandbox by failing (see Execs.exec), so only
	// other callers pay for a liveness probe here.
	case !forExec && !b.Alive(ctx, info):
		reason = "sandbox is gone"
	}
	if reason == "" {
		r.sessions.reuse(s, skills, forExec)
		return true, skills, nil
	}
	r.log.Info().Str("session_id", spec.SessionID).Str("reason", reason).Msg("recreating session")
	if err := r.destroy(ctx, s, "recreate", false); err != nil {
		return false, nil, err
	}
	r.counters.recreated.Add(1)
	return false, skills, nil
}

// closedChan is getOrCreate's "start over at once".
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// create makes spec's session on b within max_sessions; the caller holds
// the id lock.
func (r *Runtime) create(ctx context.Context, b backends.Backend, spec Spec, skills []backends.MountSpec, forExec bool) (_ *session, created bool, wait <-chan struct{}, _ error) {
	// A reservation also keeps box_init from replacing the backend
	// (backendSelector.install): once it is held, b stays the backend in
	// use if it is now.
	if err := r.sessions.reserve(r.Config().Limits.MaxSessions); err != nil {
		return nil, false, nil, err
	}
	if r.backends.current() != b {
		// box_init selected another backend since b was taken; a sandbox
		// made on b now would be one the runtime no longer reaches.
		r.sessions.unreserve()
		return nil, false, closedChan, nil
	}
	if !r.life.enter(&r.inflight) {
		r.sessions.unreserve()
		return nil, false, nil, errShuttingDown()
	}
	defer r.inflight.Done()
	info, err := r.startSession(ctx, b, spec, skills)
	if err != nil {
		r.sessions.unreserve()
		return nil, false, nil, err
	}
	if r.life.shuttingDown() {
		// Close is waiting for this creation (inflight) and has not
		// closed the backend yet: the sandbox goes before it does.
		r.sessions.unreserve()
		_ = b.StopSession(context.WithoutCancel(ctx), info)
		return nil, false, nil, errShuttingDown()
	}
	s := r.sessions.insertCreated(spec, info, skills, forExec)
	r.events.publish(spec.SessionID, EventCreated, map[string]any{"backend": info.BackendName})
	r.log.Info().Str("session_id", spec.SessionID).Str("backend", info.BackendName).
		Str("backend_session_id", info.BackendSessionID).Msg("session created")
	return s, true, nil, nil
}

// startSession starts spec's sandbox (from a warm pool when one fits) and
// fills it when spec restores a snapshot or a fork. Creation outlives the
// request: a host that gives up must not leave a half-made sandbox behind.
func (r *Runtime) startSession(ctx context.Context, b backends.Backend, spec Spec, skills []backends.MountSpec) (backends.Session, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	start := spec.SandboxSpec
	secrets, err := resolveSecrets(spec.SecretParams, r.Config().Egress.SecretsFile)
	if err != nil {
		return backends.Session{}, err
	}
	start.Secrets = secrets
	// An update recorded for an earlier session of this id (whose delete
	// failed) must not reach the new one.
	r.egress.records.drop(start.SessionID)
	if !b.Describe().SkillsLive {
		start.ExtraMounts = append(slices.Clone(spec.ExtraMounts), skills...)
	}
	info, err := r.pools.startSandbox(cctx, b, spec, start)
	if err != nil {
		return info, err
	}
	if spec.restore != nil {
		err = spec.restore(cctx, info)
	}
	if err == nil {
		if err = r.recordSecrets(info, spec.SecretParams); err != nil {
			err = boxerr.Failure("cannot record session %s's secrets in the state directory: %v", spec.SessionID, err).Wrap(err)
		}
	}
	if err != nil {
		_ = b.StopSession(context.WithoutCancel(ctx), info)
	}
	return info, err
}

// SessionDetails is box_get_session's result: the session plus its managed
// processes.
type SessionDetails struct {
	SessionInfo
	ManagedProcesses map[string]ProcessInfo `json:"managed_processes,omitempty"`
	ManagedProcess   *ProcessInfo           `json:"managed_process,omitempty"`
	// Network is the egress proxy's view of a session with network.
	Network *NetworkStatus `json:"network,omitempty"`
}

// MarshalJSON flattens the session info and adds the process fields; the
// embedded SessionInfo's own MarshalJSON would otherwise drop them.
func (d SessionDetails) MarshalJSON() ([]byte, error) {
	raw, err := json.Marshal(d.SessionInfo)
	if err != nil {
		return nil, err
	}
	if d.ManagedProcesses == nil && d.Network == nil {
		return raw, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if d.Network != nil {
		if m["network"], err = json.Marshal(d.Network); err != nil {
			return nil, err
		}
	}
	if d.ManagedProcesses == nil {
		return json.Marshal(m)
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
	physical, err := resolve(ctx, id)
	if err != nil {
		return SessionDetails{}, err
	}
	s := r.sessions.get(physical)
	if s == nil {
		return SessionDetails{}, boxerr.SessionNotFound(id)
	}
	d := SessionDetails{SessionInfo: SessionInfo{r.sessions.info(s)}}
	d.Network = r.networkStatus(physical, d.Session)
	if procs := r.procs.table.infos(s); len(procs) > 0 {
		d.ManagedProcesses = procs
		if p, ok := procs[DefaultProcessID]; ok {
			d.ManagedProcess = &p
		}
	}
	return d, nil
}

// ListSessions returns the sessions of ctx's namespace, oldest first.
func (r *Runtime) ListSessions(ctx context.Context) []SessionInfo {
	return r.sessions.list(func(id string) bool { return tenant.Visible(ctx, id) })
}

// DeleteSession stops the session's processes and destroys its sandbox. A
// running exec is killed first (its caller gets BoxSessionNotFoundError);
// a delete never waits for a long command to finish on its own, not even
// when a recreate of the session (which holds the id lock) waits for it.
func (r *Runtime) DeleteSession(ctx context.Context, id string) error {
	physical, err := resolve(ctx, id)
	if err != nil {
		return err
	}
	return r.deleteSession(ctx, physical)
}

// deleteSession is DeleteSession of a physical id.
func (r *Runtime) deleteSession(ctx context.Context, id string) error {
	r.sessions.interrupt(id)
	var err error
	r.sessions.underID(id, func() {
		s := r.sessions.get(id)
		if s == nil {
			err = boxerr.SessionNotFound(id)
			return
		}
		err = r.destroy(ctx, s, "delete", true)
	})
	return err
}

// errDeleted is the cause an exec interrupted by its session's deletion
// sees.
var errDeleted = errors.New("session deleted while the command ran")

func errShuttingDown() error { return boxerr.RuntimeUnavailable("Box runtime is shutting down") }

// destroy removes s from the table and its sandbox from the backend. With
// interrupt, a running exec is cancelled (its command tree killed by the
// backend) instead of waited for.
func (r *Runtime) destroy(ctx context.Context, s *session, reason string, interrupt bool) error {
	if !r.sessions.beginDestroy(s, interrupt) {
		select {
		case <-s.deleted:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b := r.backends.current()
	r.execs.stopSession(s) // background execs die with their sandbox

	ctx = context.WithoutCancel(ctx)
	s.execMu.Lock() // waits for the exec to end (killed when interrupting)
	defer s.execMu.Unlock()
	s.op.Lock() // waits for a process start or stop
	r.procs.stopSession(ctx, s)
	info := r.sessions.info(s)
	var err error
	if b != nil {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = b.StopSession(sctx, info)
		cancel()
	}
	if err == nil {
		r.records.drop(info.SessionID)
		r.egress.records.drop(info.SessionID)
	}
	s.op.Unlock()

	r.sessions.remove(s, reason)
	close(s.deleted)
	r.ports.dropSession(info.SessionID)
	r.publishDestroyed(info.SessionID, reason)
	r.log.Info().Str("session_id", info.SessionID).Str("reason", reason).Err(err).Msg("session destroyed")
	if err != nil {
		return boxerr.Failure("destroy session %s: %v", info.SessionID, err).Wrap(err)
	}
	return nil
}
