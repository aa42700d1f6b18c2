package runtime

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// Factory builds a backend by name from the current configuration.
type Factory func(name string, cfg Config, instanceID, stateDir string) (backends.Backend, error)

// BackendOrder is the auto-selection order.
var BackendOrder = []string{"docker", "bwrap"}

// ExplicitBackends are chosen only when the configuration names them,
// never by auto-selection: auto never sends sessions to a cluster or a
// remote E2B endpoint, and "host" runs commands unsandboxed.
var ExplicitBackends = []string{"kube", "host", "e2b"}

// Health is the cached outcome of the last backend probe.
type Health struct {
	Name      string        `json:"name"`
	Available bool          `json:"available"`
	Error     string        `json:"error,omitempty"`
	CheckedAt time.Time     `json:"checked_at"`
	Latency   time.Duration `json:"-"`
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

// CloseBackend releases a backend that holds resources (a client
// connection); others need nothing.
func CloseBackend(b backends.Backend) {
	if c, ok := b.(interface{ Close() error }); ok && b != nil {
		_ = c.Close()
	}
}

// backendSelector owns the backend in use: it selects one from the
// configuration, keeps its health probe cached so no RPC waits on the
// engine, and measures its isolation once. Its lock is taken before the
// session table's (inUse), never after.
type backendSelector struct {
	egress     *egress.Proxy // handed to the backends built (Config.EgressProxy)
	factory    Factory
	settings   *settings
	instanceID string
	stateDir   string
	clock      Clock
	log        zerolog.Logger
	counters   *counters
	life       *lifecycle
	bg         *sync.WaitGroup
	probeEvery time.Duration
	// inUse reports sessions made, or being made, on the backend in use:
	// it is not replaced under them.
	inUse func() bool
	// switched runs once b replaced old (nil at the first selection).
	switched func(ctx context.Context, old, b backends.Backend)

	mu      sync.Mutex
	backend backends.Backend
	health  Health
	// selecting is closed when the selection under way ends.
	selecting chan struct{}
	iso       isolationState
	// bgCtx lives until Close; isolation measurements run in it.
	bgCtx context.Context
}

// current is the backend in use, nil before one was selected.
func (s *backendSelector) current() backends.Backend {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backend
}

// ensure returns the backend in use, selecting one when there is none, or
// BoxBackendUnavailableError.
func (s *backendSelector) ensure(ctx context.Context) (backends.Backend, error) {
	if b := s.current(); b != nil {
		return b, nil
	}
	s.selectBackend(ctx, false)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.backend == nil {
		return nil, boxerr.BackendUnavailable("no usable sandbox backend (%s). Install and start Docker (apt-get install docker.io; dockerd) or install bubblewrap (apt-get install bubblewrap); `boxrt doctor` shows what is missing", s.health.Error)
	}
	return s.backend, nil
}

// selectBackend runs one backend selection, or joins the one under way:
// concurrent first calls must not each probe, build and adopt a backend.
// With fresh (a configuration change), a selection already under way is
// waited for and then run again, as it used the previous configuration.
func (s *backendSelector) selectBackend(ctx context.Context, fresh bool) {
	for {
		running, done := s.joinOrLead()
		if done != nil {
			s.probeAndAdopt(ctx)
			s.mu.Lock()
			s.selecting = nil
			s.mu.Unlock()
			close(done)
			return
		}
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

// joinOrLead returns the selection under way to wait for, or, when there
// is none, done: the caller leads a new one and closes done at its end.
func (s *backendSelector) joinOrLead() (running <-chan struct{}, done chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.selecting != nil {
		return s.selecting, nil
	}
	s.selecting = make(chan struct{})
	return nil, s.selecting
}

// probeAndAdopt probes the candidates in order and keeps the first that
// works; then it re-adopts that backend's sessions.
func (s *backendSelector) probeAndAdopt(ctx context.Context) {
	cfg := s.settings.get()
	cfg.egressProxy = s.egress
	var errs []string
	for _, name := range Candidates(cfg.Backend) {
		b, err := s.factory(name, cfg, s.instanceID, s.stateDir)
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			start := time.Now()
			err = b.Probe(pctx)
			cancel()
			if err == nil {
				s.install(ctx, name, b, time.Since(start))
				return
			}
			CloseBackend(b)
		}
		errs = append(errs, fmt.Sprintf("%s: %v", name, err))
	}
	s.mu.Lock()
	s.health = Health{Available: false, Error: strings.Join(errs, "; "), CheckedAt: s.clock.Now()}
	s.mu.Unlock()
	s.counters.healthCheckFailures.Add(1)
	s.log.Warn().Strs("tried", Candidates(cfg.Backend)).Str("error", strings.Join(errs, "; ")).Msg("no usable backend")
}

// install makes the probed b the backend in use, unless sessions were
// made on the one in use meanwhile.
func (s *backendSelector) install(ctx context.Context, name string, b backends.Backend, latency time.Duration) {
	s.mu.Lock()
	old := s.backend
	if old != nil && s.inUse() {
		// A session was created (or began) on the old backend since
		// box_init asked for this selection: replacing the backend would
		// leave that sandbox unreachable.
		s.mu.Unlock()
		CloseBackend(b)
		s.log.Warn().Str("backend", old.Name()).Str("candidate", name).
			Msg("backend not replaced: sessions were created meanwhile")
		return
	}
	s.backend = b
	s.health = Health{Name: name, Available: true, CheckedAt: s.clock.Now(), Latency: latency}
	s.mu.Unlock()
	s.switched(ctx, old, b)
}

// healthLoop refreshes the cached probe in the background until ctx ends.
func (s *backendSelector) healthLoop(ctx context.Context) {
	tick, stop := s.clock.NewTicker(s.probeEvery)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		b := s.current()
		if b == nil {
			s.selectBackend(ctx, false)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		err := b.Probe(pctx)
		cancel()
		h := Health{Name: b.Name(), Available: err == nil, CheckedAt: s.clock.Now(), Latency: time.Since(start)}
		if err != nil {
			h.Error = err.Error()
			s.counters.healthCheckFailures.Add(1)
		}
		s.mu.Lock()
		s.health = h
		s.mu.Unlock()
	}
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

// info reports the backend in use from the health cache; with measure it
// starts measuring the backend's isolation when that has not been done.
func (s *backendSelector) info(measure bool) BackendInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := BackendInfo{Available: s.health.Available, InstanceID: s.instanceID, CheckedAt: s.health.CheckedAt.UTC(),
		Error: s.health.Error, ProbeMS: float64(s.health.Latency.Microseconds()) / 1000}
	if s.backend != nil {
		name := s.backend.Name()
		info.Name = &name
		info.Description = s.backend.Describe()
		if s.health.Available {
			info.IsolationMeasured, info.IsolationMeasuring = s.isolationLocked(s.backend, measure)
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

// runIn sets the context background measurements run in (Start).
func (s *backendSelector) runIn(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bgCtx = ctx
}
