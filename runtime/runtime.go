package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/atomicfile"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/keyed"
)

// Factory builds a backend by name from the current configuration.
type Factory func(name string, cfg Config, instanceID, stateDir string) (backends.Backend, error)

// BackendOrder is the auto-selection order.
var BackendOrder = []string{"docker", "bwrap"}

// ExplicitBackends are chosen only when the configuration names them,
// never by auto-selection: auto never sends sessions to a cluster, and
// "host" runs commands unsandboxed.
var ExplicitBackends = []string{"kube", "host"}

// Runtime is the session table and everything around it.
type Runtime struct {
	log        zerolog.Logger
	clock      Clock
	factory    Factory
	stateDir   string
	instanceID string
	startedAt  time.Time
	probeEvery time.Duration

	mu  sync.Mutex
	cfg Config
	// lineBudget is shared by every managed process's unfinished stdout line.
	lineBudget *lineBudget
	backend    backends.Backend
	health     Health
	sessions   map[string]*session
	// execs are the live execs (execs.go).
	execs execTable
	// selecting is closed when the backend selection under way ends.
	selecting    chan struct{}
	creating     int
	closing      int
	shuttingDown bool
	// procStarting counts managed-process starts between their capacity
	// check and their entry in the table: the check and the reservation
	// are one step, so starts on different sessions cannot both pass.
	procStarting int
	// inflight counts the session creations, resumes and process starts
	// under way; Close waits for them (Add only under mu while not
	// shuttingDown, so no Add races Close's Wait).
	inflight sync.WaitGroup
	// boxExecs counts the execs that hold a session's exec lock (box_exec),
	// for Close to wait for; added to like inflight.
	boxExecs sync.WaitGroup
	counters Counters

	idLocks keyed.Locks

	bg     sync.WaitGroup
	bgCtx  context.Context // lives until Close; set by Start
	stopBG context.CancelFunc
	iso    isolationState
	// reaperKick restarts the reaper loop when the TTL changes.
	reaperKick chan struct{}
	// poolKick wakes the pool loop when the configuration changes.
	poolKick chan struct{}

	execObserver func(ExecEvent)
	skills       SkillResolver
	snaps        snapshotStores
	pools        warmPools

	// sessionsEndAtClose: the state directory dies with this runtime, so
	// nothing may outlive it (WithSessionsEndingAtClose).
	sessionsEndAtClose bool
}

// Health is the cached outcome of the last backend probe.
type Health struct {
	Name      string        `json:"name"`
	Available bool          `json:"available"`
	Error     string        `json:"error,omitempty"`
	CheckedAt time.Time     `json:"checked_at"`
	Latency   time.Duration `json:"-"`
}

// Counters are lifetime totals for box_status.
type Counters struct {
	TotalCreated        int64 `json:"total_created"`
	TotalReused         int64 `json:"total_reused"`
	TotalCleaned        int64 `json:"total_cleaned"`
	TotalReaped         int64 `json:"total_reaped"`
	TotalRecreated      int64 `json:"total_recreated"`
	TotalSuspended      int64 `json:"total_suspended"`
	TotalResumed        int64 `json:"total_resumed"`
	PoolHits            int64 `json:"total_pool_hits"`
	PoolMisses          int64 `json:"total_pool_misses"`
	TotalExecs          int64 `json:"total_execs"`
	TotalTimeouts       int64 `json:"total_timeouts"`
	TotalTruncated      int64 `json:"total_truncated_outputs"`
	ProcessesStarted    int64 `json:"total_processes_started"`
	ProcessesExited     int64 `json:"total_processes_exited"`
	ProcessesReplaced   int64 `json:"total_processes_replaced"`
	HealthCheckFailures int64 `json:"health_check_failures"`
}

// Option configures a Runtime.
type Option func(*Runtime)

// WithClock replaces the wall clock (tests).
func WithClock(c Clock) Option { return func(r *Runtime) { r.clock = c } }

// WithLogger sets the logger.
func WithLogger(l zerolog.Logger) Option { return func(r *Runtime) { r.log = l } }

// WithExecObserver is called after every exec, for metrics.
func WithExecObserver(f func(ExecEvent)) Option { return func(r *Runtime) { r.execObserver = f } }

// WithSessionsEndingAtClose makes Close destroy every session, persistent
// and suspended ones included, for a runtime whose state directory is
// removed after it: a sandbox kept for re-adoption would be labelled with
// an instance id nobody holds any more, an orphan no runtime ever serves
// or removes.
func WithSessionsEndingAtClose() Option { return func(r *Runtime) { r.sessionsEndAtClose = true } }

// WithProbeInterval sets how often backend health is refreshed.
func WithProbeInterval(d time.Duration) Option { return func(r *Runtime) { r.probeEvery = d } }

// New returns a Runtime that keeps its state (the instance id, backend
// state) in stateDir. Nothing runs until Start.
func New(cfg Config, factory Factory, stateDir string, opts ...Option) (*Runtime, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := cfg.mountRoots(stateDir); err != nil {
		return nil, err
	}
	r := &Runtime{
		log:        zerolog.Nop(),
		clock:      realClock{},
		factory:    factory,
		stateDir:   stateDir,
		cfg:        cfg,
		sessions:   map[string]*session{},
		probeEvery: 30 * time.Second,
		reaperKick: make(chan struct{}, 1),
		poolKick:   make(chan struct{}, 1),
		pools:      warmPools{ready: map[string][]backends.Session{}, starting: map[string]int{}, lastTake: map[string]time.Time{}},
	}
	r.lineBudget = newLineBudget(func() int { return r.Config().Limits.RelayLineBufferBytes })
	r.execs.keep = finishedLimitsOf(cfg.Limits)
	for _, o := range opts {
		o(r)
	}
	r.startedAt = r.clock.Now()
	id, err := loadInstanceID(stateDir)
	if err != nil {
		return nil, err
	}
	r.instanceID = id
	return r, nil
}

// loadInstanceID returns the stable installation id kept in stateDir,
// creating it on first start. Sandboxes are labelled with it so a restarted
// boxrt re-adopts its own and never touches another installation's.
func loadInstanceID(stateDir string) (string, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return "", fmt.Errorf("create state dir %s: %w", stateDir, err)
	}
	path := filepath.Join(stateDir, "instance-id")
	if b, err := os.ReadFile(path); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	}
	buf := make([]byte, 6)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	id := hex.EncodeToString(buf)
	if err := atomicfile.Write(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write instance id: %w", err)
	}
	return id, nil
}

// InstanceID is this installation's stable id.
func (r *Runtime) InstanceID() string { return r.instanceID }

// StartedAt is when the runtime was created.
func (r *Runtime) StartedAt() time.Time { return r.startedAt }

// Start selects a backend, re-adopts this installation's sandboxes and
// starts the reaper and the health refresher.
func (r *Runtime) Start(ctx context.Context) {
	r.selectBackend(ctx, false)
	r.tidySnapshotStore()
	bgCtx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	r.bgCtx = bgCtx
	r.mu.Unlock()
	r.stopBG = cancel
	r.bg.Add(3)
	go r.reaperLoop(bgCtx)
	go r.healthLoop(bgCtx)
	go r.poolLoop(bgCtx)
}

// Config returns a copy of the configuration in force.
func (r *Runtime) Config() Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

// ApplyConfig merges patch into the configuration atomically. When no
// session exists and the backend section changed, the backend is selected
// again (the reference does the same).
// It returns the keys it ignored because boxrt does not know them.
func (r *Runtime) ApplyConfig(ctx context.Context, patch json.RawMessage, decode Decoder) ([]string, error) {
	r.mu.Lock()
	next, ignored, err := r.cfg.Merge(patch, decode)
	if err == nil {
		_, err = next.mountRoots(r.stateDir)
	}
	if err != nil {
		r.mu.Unlock()
		return nil, err
	}
	if len(ignored) > 0 {
		r.log.Info().Strs("ignored_keys", ignored).Msg("box_init: ignored config keys boxrt does not use")
	}
	prev := r.cfg
	r.cfg = next
	reselect := len(r.sessions) == 0 && r.creating == 0 &&
		(prev.Backend != next.Backend || prev.Docker != next.Docker || !reflect.DeepEqual(prev.Kube, next.Kube) || r.backend == nil)
	ttlChanged := prev.Limits.SessionTTLSec != next.Limits.SessionTTLSec
	r.mu.Unlock()
	if ttlChanged {
		signal(r.reaperKick)
	}
	signal(r.poolKick)
	if reselect {
		r.selectBackend(ctx, true)
	}
	return ignored, nil
}

// autoBackend reports whether a backend config value asks for
// auto-selection ("local" is the reference's name for it).
func autoBackend(choice string) bool { return choice == "" || choice == "auto" || choice == "local" }

// Candidates returns the backend names to try, in order, for a backend
// config value.
func Candidates(choice string) []string {
	if autoBackend(choice) {
		return BackendOrder
	}
	return []string{choice}
}

// selectBackend runs one backend selection, or joins the one under way:
// concurrent first calls must not each probe, build and adopt a backend.
// With fresh (a configuration change), a selection already under way is
// waited for and then run again, as it used the previous configuration.
func (r *Runtime) selectBackend(ctx context.Context, fresh bool) {
	for {
		r.mu.Lock()
		running := r.selecting
		if running == nil {
			done := make(chan struct{})
			r.selecting = done
			r.mu.Unlock()
			r.probeAndAdopt(ctx)
			r.mu.Lock()
			r.selecting = nil
			r.mu.Unlock()
			close(done)
			return
		}
		r.mu.Unlock()
		select {
		case <-running:
		case <-ctx.Done():
			return
		}
		if !fresh {
			return
		}
	}
}

// probeAndAdopt probes the candidates in order and keeps the first that
// works; then it re-adopts that backend's sessions.
func (r *Runtime) probeAndAdopt(ctx context.Context) {
	cfg := r.Config()
	var errs []string
	for _, name := range Candidates(cfg.Backend) {
		b, err := r.factory(name, cfg, r.instanceID, r.stateDir)
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			start := time.Now()
			err = b.Probe(pctx)
			cancel()
			if err == nil {
				r.mu.Lock()
				old := r.backend
				if old != nil && (len(r.sessions) > 0 || r.creating > 0) {
					// A session was created (or began) on the old backend
					// since box_init asked for this selection: replacing
					// the backend would leave that sandbox unreachable.
					r.mu.Unlock()
					CloseBackend(b)
					r.log.Warn().Str("backend", old.Name()).Str("candidate", name).
						Msg("backend not replaced: sessions were created meanwhile")
					return
				}
				r.backend = b
				r.health = Health{Name: name, Available: true, CheckedAt: r.clock.Now(), Latency: time.Since(start)}
				r.mu.Unlock()
				r.drainPools(ctx, old) // its warm sandboxes are not reachable through b
				CloseBackend(old)
				r.log.Info().Str("backend", name).Str("instance_id", r.instanceID).Msg("backend selected")
				r.adopt(ctx, b)
				return
			}
			CloseBackend(b)
		}
		errs = append(errs, fmt.Sprintf("%s: %v", name, err))
	}
	r.mu.Lock()
	r.health = Health{Available: false, Error: strings.Join(errs, "; "), CheckedAt: r.clock.Now()}
	r.counters.HealthCheckFailures++
	r.mu.Unlock()
	r.log.Warn().Strs("tried", Candidates(cfg.Backend)).Str("error", strings.Join(errs, "; ")).Msg("no usable backend")
}

// CloseBackend releases a backend that holds resources (a client
// connection); others need nothing.
func CloseBackend(b backends.Backend) {
	if c, ok := b.(interface{ Close() error }); ok && b != nil {
		_ = c.Close()
	}
}

// adopt puts the backend's surviving sandboxes of this installation back in
// the session table.
func (r *Runtime) adopt(ctx context.Context, b backends.Backend) {
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	infos, err := b.Adopt(actx)
	if err != nil {
		r.log.Warn().Err(err).Int("adopted", len(infos)).Msg("cannot re-adopt some sessions")
	}
	roots, rootsErr := r.Config().mountRoots(r.stateDir)
	kept := infos[:0:0]
	for _, info := range infos {
		if strings.HasPrefix(info.SessionID, PoolSessionPrefix) {
			// An unclaimed pooled sandbox of an earlier process: the
			// pool refills, this one goes.
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			_ = b.StopSession(sctx, info)
			cancel()
			continue
		}
		if err := errors.Join(rootsErr, adoptedPathsAllowed(info, roots)); err != nil {
			// The sandbox binds what this configuration no longer allows
			// (the allow-list changed, or a path was swapped for a symlink
			// while boxrt was down): it is not served again.
			r.log.Warn().Err(err).Str("session_id", info.SessionID).Str("backend_session_id", info.BackendSessionID).Msg("not re-adopting session")
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			_ = b.StopSession(sctx, info)
			cancel()
			continue
		}
		kept = append(kept, info)
	}
	now := r.clock.Now()
	var duplicates []backends.Session
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		// A second sandbox for a served session id (one whose stop failed
		// before a recreate, say) would otherwise run untracked forever.
		for _, info := range duplicates {
			r.log.Warn().Str("session_id", info.SessionID).Str("backend_session_id", info.BackendSessionID).Msg("stopping a duplicate sandbox of a served session")
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			_ = b.StopSession(sctx, info)
			cancel()
		}
	}()
	for _, info := range kept {
		if s, exists := r.sessions[info.SessionID]; exists {
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
			s.resumeProcs = r.readSuspendRecord(info)
		}
		r.sessions[info.SessionID] = s
		r.log.Info().Str("session_id", info.SessionID).Str("backend_session_id", info.BackendSessionID).Msg("re-adopted session")
	}
}

// adoptedPathsAllowed checks an adopted session's host paths against the
// current allow-list: each must still resolve to itself inside a root.
// Skill mounts are boxrt's own and only re-checked by the backend.
func adoptedPathsAllowed(info backends.Session, roots []string) error {
	check := func(field, p string) error {
		resolved, err := backends.ResolveHostPath(field, p, roots)
		if err == nil && resolved != p {
			err = boxerr.Validation(field, "%s %s now resolves to %s", field, p, resolved)
		}
		return err
	}
	if info.HostPath != "" && info.HostPathMode != backends.MountNone {
		if err := check("host_path", info.HostPath); err != nil {
			return err
		}
	}
	user, _ := splitSkillMounts(info)
	for i, m := range user {
		if err := check(fmt.Sprintf("extra_mounts[%d].host_path", i), m.HostPath); err != nil {
			return err
		}
	}
	return nil
}

// currentBackend returns the selected backend or BoxBackendUnavailableError.
func (r *Runtime) currentBackend(ctx context.Context) (backends.Backend, error) {
	r.mu.Lock()
	b := r.backend
	r.mu.Unlock()
	if b != nil {
		return b, nil
	}
	r.selectBackend(ctx, false)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.backend == nil {
		return nil, boxerr.BackendUnavailable("no usable sandbox backend (%s). Install and start Docker (apt-get install docker.io; dockerd) or install bubblewrap (apt-get install bubblewrap); `boxrt doctor` shows what is missing", r.health.Error)
	}
	return r.backend, nil
}

// BackendInfo is what box_get_backend_info returns. It never touches the
// engine: it reports the cached probe.
type BackendInfo struct {
	Name      *string `json:"name"`
	Available bool    `json:"available"`
	backends.Description
	InstanceID string    `json:"instance_id"`
	CheckedAt  time.Time `json:"checked_at"`
	Error      string    `json:"error,omitempty"`
	ProbeMS    float64   `json:"probe_ms"`
	// Isolation is measured by probing a real sandbox of each level (see
	// backends.IsolationReport), in the background after the first
	// box_get_backend_info (MeasuredBackendInfo); IsolationMeasuring is
	// true until it is done. Not "isolation": that is Description's
	// one-line summary.
	IsolationMeasured  []backends.IsolationReport `json:"isolation_measured"`
	IsolationMeasuring bool                       `json:"isolation_measuring"`
}

// BackendInfo reports the selected backend from the health cache, with
// the isolation measured so far (box_status, box_health).
func (r *Runtime) BackendInfo() BackendInfo { return r.backendInfo(false) }

// MeasuredBackendInfo is BackendInfo that also starts measuring the
// backend's isolation when it has not been (box_get_backend_info): a probe
// starts a real sandbox, which box_health, polled by hosts, should not.
func (r *Runtime) MeasuredBackendInfo() BackendInfo { return r.backendInfo(true) }

func (r *Runtime) backendInfo(measure bool) BackendInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	info := BackendInfo{Available: r.health.Available, InstanceID: r.instanceID, CheckedAt: r.health.CheckedAt.UTC(),
		Error: r.health.Error, ProbeMS: float64(r.health.Latency.Microseconds()) / 1000}
	if r.backend != nil {
		name := r.backend.Name()
		info.Name = &name
		info.Description = r.backend.Describe()
		if r.health.Available {
			info.IsolationMeasured, info.IsolationMeasuring = r.isolationLocked(r.backend, measure)
		}
	}
	if info.IsolationMeasured == nil {
		info.IsolationMeasured = []backends.IsolationReport{}
	}
	if info.EnforcedLimits == nil {
		info.EnforcedLimits = []string{}
	}
	if info.IsolationLevels == nil {
		info.IsolationLevels = []string{}
	}
	return info
}

// healthLoop refreshes the cached probe in the background so no RPC waits
// on the engine.
func (r *Runtime) healthLoop(ctx context.Context) {
	defer r.bg.Done()
	tick, stop := r.clock.NewTicker(r.probeEvery)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		r.mu.Lock()
		b := r.backend
		r.mu.Unlock()
		if b == nil {
			r.selectBackend(ctx, false)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		err := b.Probe(pctx)
		cancel()
		r.mu.Lock()
		r.health = Health{Name: b.Name(), Available: err == nil, CheckedAt: r.clock.Now(), Latency: time.Since(start)}
		if err != nil {
			r.health.Error = err.Error()
			r.counters.HealthCheckFailures++
		}
		r.mu.Unlock()
	}
}

// Status is the box_status result.
type Status struct {
	Backend          BackendInfo  `json:"backend"`
	ActiveSessions   int          `json:"active_sessions"`
	ManagedProcesses int          `json:"managed_processes"`
	SessionTTLSec    int          `json:"session_ttl_sec"`
	Limits           Limits       `json:"limits"`
	UptimeSec        float64      `json:"uptime_sec"`
	InstanceID       string       `json:"instance_id"`
	Pools            []PoolStatus `json:"pools,omitempty"`
	Counters
}

// Status snapshots the runtime.
func (r *Runtime) Status() Status {
	backend := r.BackendInfo()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{
		Backend:        backend,
		ActiveSessions: len(r.sessions),
		SessionTTLSec:  r.cfg.Limits.SessionTTLSec,
		Limits:         r.cfg.Limits,
		UptimeSec:      r.clock.Now().Sub(r.startedAt).Seconds(),
		InstanceID:     r.instanceID,
		Counters:       r.counters,
	}
	if len(r.cfg.Durable.Pools) > 0 {
		st.Pools = r.poolStatus(r.cfg.Durable)
	}
	for _, s := range r.sessions {
		st.ManagedProcesses += s.runningProcesses()
	}
	return st
}

// ShutdownAll destroys every session, persistent ones included (the
// box_shutdown method). The runtime keeps serving afterwards.
func (r *Runtime) ShutdownAll(ctx context.Context) error {
	return r.destroyWhere(ctx, func(*session) bool { return true }, "shutdown")
}

// Close stops background work, stops every exec and managed process and
// destroys the non-persistent sessions; persistent and suspended ones stay
// for the next start to re-adopt (unless WithSessionsEndingAtClose). The
// order matters: nothing new starts once shuttingDown is set; background
// work (reaper, pool refills) ends; creations, resumes and process starts
// under way finish, so what they made is seen (or stopped by them) before the backend closes; execs are
// stopped so that no destroy waits for a command; then the pools drain,
// sessions go, and the processes of the kept sessions stop.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	r.shuttingDown = true
	r.mu.Unlock()
	if r.stopBG != nil {
		r.stopBG()
	}
	r.bg.Wait()
	waitErr := r.waitInflight(ctx)
	r.stopAllExecs()
	r.mu.Lock()
	b := r.backend
	r.mu.Unlock()
	r.drainPools(ctx, b)
	err := r.destroyWhere(ctx, func(s *session) bool {
		return r.sessionsEndAtClose || !s.info.Persistent && s.info.State != backends.StateSuspended
	}, "exit")
	r.stopAllProcesses(ctx)
	if waitErr != nil {
		// A straggling creation stops its sandbox itself when it ends; it
		// needs the backend open for that.
		r.log.Warn().Err(waitErr).Msg("closing with session creations under way")
		return errors.Join(waitErr, err)
	}
	CloseBackend(b)
	return err
}

// waitInflight waits for the creations, resumes and process starts under
// way, or until ctx ends.
func (r *Runtime) waitInflight(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		r.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for session creations: %w", context.Cause(ctx))
	}
}

func (r *Runtime) destroyWhere(ctx context.Context, match func(*session) bool, reason string) error {
	r.mu.Lock()
	var ids []string
	for id, s := range r.sessions {
		if match(s) {
			ids = append(ids, id)
		}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	errCh := make(chan error, len(ids))
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.deleteSession(ctx, id); err != nil && !errors.Is(err, boxerr.ErrSessionNotFound) {
				errCh <- err
			}
		}()
	}
	wg.Wait()
	close(errCh)
	var errs []error
	for err := range errCh {
		errs = append(errs, err)
	}
	if len(ids) > 0 {
		r.log.Info().Int("sessions", len(ids)).Str("reason", reason).Msg("destroyed sessions")
	}
	return errors.Join(errs...)
}
