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
	"github.com/boxrt/boxrt/runtime/snapshots"
)

// Runtime composes the parts that hold boxrt's state, each behind its own
// lock: the settings, the backend selector, the session table, the exec
// and process tables (Execs, Processes), the warm pools, the snapshot
// stores and the counters. What it keeps itself is the coordination of a
// session's life across them: get-or-create, suspend and resume,
// destruction, reaping, shutdown. Where two locks are held at once, the
// backend selector's is taken before the session table's.
type Runtime struct {
	log        zerolog.Logger
	clock      Clock
	stateDir   string
	instanceID string
	startedAt  time.Time

	settings  settings
	backends  *backendSelector
	sessions  *sessionTable
	execs     *Execs
	procs     *Processes
	files     *Files
	snapshots *Snapshots
	pools     *warmPools
	records   suspendRecords
	counters  counters
	events    *Events
	webhook   *webhook
	ports     *Ports
	egress    *egressHub

	// life gates the work Close waits for: inflight (session creations,
	// resumes and process starts under way) and bg (background loops).
	life     lifecycle
	inflight sync.WaitGroup
	bg       sync.WaitGroup
	stopBG   context.CancelFunc
	// reaperKick restarts the reaper loop when the TTL changes.
	reaperKick chan struct{}

	// Set by options.
	factory      Factory
	probeEvery   time.Duration
	execObserver func(ExecEvent)
	skills       SkillResolver
	snapStore    snapshots.Store
	// sessionsEndAtClose: the state directory dies with this runtime, so
	// nothing may outlive it (WithSessionsEndingAtClose).
	sessionsEndAtClose bool
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
	cfg = cfg.WithStateDir(stateDir)
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
		settings:   settings{cfg: cfg},
		probeEvery: 30 * time.Second,
		reaperKick: make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(r)
	}
	r.startedAt = r.clock.Now()
	id, err := loadInstanceID(stateDir)
	if err != nil {
		return nil, err
	}
	r.instanceID = id
	r.sessions = newSessionTable(r.clock, &r.counters)
	r.events = &Events{clock: r.clock}
	r.webhook = newWebhook(r)
	r.ports = newPorts(r)
	r.records = suspendRecords{sessionRecords{dir: filepath.Join(stateDir, "suspended"), log: r.log}}
	if r.egress, err = newEgressHub(cfg.Egress, stateDir, func() string { return r.Config().Egress.SecretsFile }, r.log); err != nil {
		return nil, err
	}
	r.backends = &backendSelector{egress: r.egress.proxy, factory: factory, settings: &r.settings, instanceID: id, stateDir: stateDir,
		clock: r.clock, log: r.log, counters: &r.counters, life: &r.life, bg: &r.bg, probeEvery: r.probeEvery,
		inUse: r.sessions.inUse, switched: r.backendSwitched}
	r.pools = newWarmPools(r)
	r.execs = newExecs(r, finishedLimitsOf(cfg.Limits))
	r.procs = newProcesses(r)
	r.files = &Files{r: r}
	r.snapshots = &Snapshots{r: r, custom: r.snapStore}
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

// Execs is the exec service: box_exec and the live execs.
func (r *Runtime) Execs() *Execs { return r.execs }

// Processes is the managed-process service.
func (r *Runtime) Processes() *Processes { return r.procs }

// Files is the file API of the sessions.
func (r *Runtime) Files() *Files { return r.files }

// Snapshots is the snapshot service: snapshots, restores and forks.
func (r *Runtime) Snapshots() *Snapshots { return r.snapshots }

// Start selects a backend, re-adopts this installation's sandboxes and
// starts the reaper, the health refresher and the pool filler.
func (r *Runtime) Start(ctx context.Context) {
	r.backends.selectBackend(ctx, false)
	r.snapshots.tidy()
	bgCtx, cancel := context.WithCancel(context.Background())
	r.backends.runIn(bgCtx)
	r.stopBG = cancel
	for _, loop := range []func(context.Context){r.reaperLoop, r.backends.healthLoop, r.pools.loop, r.webhook.loop} {
		r.bg.Add(1)
		go func() {
			defer r.bg.Done()
			loop(bgCtx)
		}()
	}
}

// Config returns a copy of the configuration in force.
func (r *Runtime) Config() Config { return r.settings.get() }

// ApplyConfig merges patch into the configuration atomically. When no
// session exists and the backend section changed, the backend is selected
// again (the reference does the same).
// It returns the keys it ignored because boxrt does not know them.
func (r *Runtime) ApplyConfig(ctx context.Context, patch json.RawMessage, decode Decoder) ([]string, error) {
	prev, next, ignored, err := r.settings.apply(patch, decode, r.stateDir)
	if err != nil {
		return nil, err
	}
	if len(ignored) > 0 {
		r.log.Info().Strs("ignored_keys", ignored).Msg("box_init: ignored config keys boxrt does not use")
	}
	backendChanged := prev.Backend != next.Backend || prev.Docker != next.Docker || prev.Bwrap != next.Bwrap ||
		!reflect.DeepEqual(prev.Kube, next.Kube) || !reflect.DeepEqual(prev.E2B, next.E2B) || r.backends.current() == nil
	if prev.Limits.SessionTTLSec != next.Limits.SessionTTLSec {
		signal(r.reaperKick)
	}
	r.pools.kick()
	if backendChanged && !r.sessions.inUse() {
		r.backends.selectBackend(ctx, true)
	}
	return ignored, nil
}

// backendSwitched follows a backend selection: the previous backend's
// warm sandboxes go (they are not reachable through b), and b's
// surviving sandboxes of this installation are adopted.
func (r *Runtime) backendSwitched(ctx context.Context, old, b backends.Backend) {
	r.pools.drain(ctx, old)
	CloseBackend(old)
	r.log.Info().Str("backend", b.Name()).Str("instance_id", r.instanceID).Msg("backend selected")
	r.adopt(ctx, b)
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
	stop := func(info backends.Session) {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		_ = b.StopSession(sctx, info)
		cancel()
	}
	kept := infos[:0:0]
	for _, info := range infos {
		if strings.HasPrefix(info.SessionID, PoolSessionPrefix) {
			// An unclaimed pooled sandbox of an earlier process: the
			// pool refills, this one goes.
			stop(info)
			continue
		}
		if err := errors.Join(rootsErr, adoptedPathsAllowed(info, roots)); err != nil {
			// The sandbox binds what this configuration no longer allows
			// (the allow-list changed, or a path was swapped for a symlink
			// while boxrt was down): it is not served again.
			r.log.Warn().Err(err).Str("session_id", info.SessionID).Str("backend_session_id", info.BackendSessionID).Msg("not re-adopting session")
			stop(info)
			continue
		}
		kept = append(kept, r.egress.records.adopted(info))
	}
	adopted, duplicates := r.sessions.adopt(kept, r.records.read)
	r.egress.records.retain(func(id string) bool { return r.sessions.get(id) != nil })
	for _, info := range adopted {
		r.log.Info().Str("session_id", info.SessionID).Str("backend_session_id", info.BackendSessionID).Msg("re-adopted session")
	}
	// A second sandbox for a served session id (one whose stop failed
	// before a recreate, say) would otherwise run untracked forever.
	for _, info := range duplicates {
		r.log.Warn().Str("session_id", info.SessionID).Str("backend_session_id", info.BackendSessionID).Msg("stopping a duplicate sandbox of a served session")
		stop(info)
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

// BackendInfo reports the selected backend from the health cache, with
// the isolation measured so far (box_status, box_health).
func (r *Runtime) BackendInfo() BackendInfo { return r.backends.info(false) }

// MeasuredBackendInfo is BackendInfo that also starts measuring the
// backend's isolation when it has not been (box_get_backend_info): a probe
// starts a real sandbox, which box_health, polled by hosts, should not.
func (r *Runtime) MeasuredBackendInfo() BackendInfo { return r.backends.info(true) }

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
	Events           EventStats   `json:"events"`
	Counters
}

// Status snapshots the runtime.
func (r *Runtime) Status() Status {
	cfg := r.Config()
	st := Status{
		Backend:          r.BackendInfo(),
		ManagedProcesses: r.procs.table.running(),
		SessionTTLSec:    cfg.Limits.SessionTTLSec,
		Limits:           cfg.Limits,
		UptimeSec:        r.clock.Now().Sub(r.startedAt).Seconds(),
		InstanceID:       r.instanceID,
	}
	st.ActiveSessions, st.Counters = r.sessions.census()
	st.Events = EventStats{Dropped: r.events.Dropped() - r.webhook.sub.Dropped(), Webhook: r.WebhookStats()}
	if len(cfg.Durable.Pools) > 0 {
		st.Pools = r.pools.status(cfg.Durable)
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
// order matters: nothing new starts once the gate is shut; background
// work (reaper, pool refills) ends; creations, resumes and process starts
// under way finish, so what they made is seen (or stopped by them) before
// the backend closes; execs are stopped so that no destroy waits for a
// command; then the pools drain, sessions go, and the processes of the
// kept sessions stop.
func (r *Runtime) Close(ctx context.Context) error {
	r.life.shutDown()
	if r.stopBG != nil {
		r.stopBG()
	}
	r.bg.Wait()
	waitErr := waitGroup(ctx, &r.inflight, "session creations")
	r.execs.stopAll()
	b := r.backends.current()
	r.pools.drain(ctx, b)
	err := r.destroyWhere(ctx, func(s *session) bool {
		return r.sessionsEndAtClose || !s.info.Persistent && s.info.State != backends.StateSuspended
	}, "exit")
	r.procs.stopAll(ctx)
	if waitErr != nil {
		// A straggling creation stops its sandbox itself when it ends; it
		// needs the backend open for that.
		r.log.Warn().Err(waitErr).Msg("closing with session creations under way")
		return errors.Join(waitErr, err)
	}
	CloseBackend(b)
	r.egress.proxy.Close()
	return err
}

// waitGroup waits for wg, or until ctx ends.
func waitGroup(ctx context.Context, wg *sync.WaitGroup, what string) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for %s: %w", what, context.Cause(ctx))
	}
}
