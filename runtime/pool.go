package runtime

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// PoolSessionPrefix starts the placeholder session id of every pooled
// sandbox; hosts cannot use such ids, and adoption removes unclaimed pooled
// sandboxes a crash left (the pool refills).
const PoolSessionPrefix = backends.PoolSessionPrefix

// poolTick is how often the pool loop checks its pools.
const poolTick = 50 * time.Millisecond

// refillQuiet is the least time between a take and the refill it causes,
// so that the session that took a sandbox runs its first command without
// a sandbox start competing for the CPU.
const refillQuiet = 300 * time.Millisecond

// warmPools keep sandboxes started ahead of need, by pool name, and hand
// them to new sessions whose spec fits.
type warmPools struct {
	backends *backendSelector
	settings *settings
	life     *lifecycle
	counters *counters
	log      zerolog.Logger
	// kicked wakes the pool loop when the configuration changes.
	kicked chan struct{}

	mu       sync.Mutex
	ready    map[string][]backends.Session
	starting map[string]int
	lastTake map[string]time.Time
	seq      int
}

func newWarmPools(r *Runtime) *warmPools {
	return &warmPools{backends: r.backends, settings: &r.settings, life: &r.life, counters: &r.counters, log: r.log,
		kicked: make(chan struct{}, 1),
		ready:  map[string][]backends.Session{}, starting: map[string]int{}, lastTake: map[string]time.Time{}}
}

// kick has the pools checked against a changed configuration.
func (p *warmPools) kick() { signal(p.kicked) }

// checkPoolID refuses a host session id in the pool's namespace.
func checkPoolID(id string) error {
	if strings.HasPrefix(id, PoolSessionPrefix) {
		return boxerr.Validation("session_id", "session ids starting with %s are reserved for warm pools", PoolSessionPrefix)
	}
	return nil
}

// poolFor returns the name of a pool whose sandboxes fit spec, or "". Only
// specs without a host path, extra mounts or skills fit; a restore or fork
// fills the pooled sandbox like a fresh one.
func (p *warmPools) poolFor(b backends.Backend, spec Spec) string {
	if hostWorkspace(spec.Sandbox) || len(spec.ExtraMounts) > 0 {
		return ""
	}
	for _, pc := range p.settings.get().Durable.Pools {
		if pc.Size == 0 || (pc.Backend != "" && pc.Backend != b.Name()) {
			continue
		}
		sb, err := pc.sandbox()
		if err != nil {
			continue
		}
		if sb.Image == "" {
			sb.Image = b.DefaultImage()
		}
		sb.Persistent = spec.Persistent
		if field, _, _ := compatibility(sb, spec.Sandbox); field == "" {
			return pc.Name
		}
	}
	return ""
}

// startSandbox starts spec's sandbox, taking a pooled one when a pool fits
// and has one ready (claimed for spec's session); otherwise, or when the
// claim fails, it starts one cold.
func (p *warmPools) startSandbox(ctx context.Context, b backends.Backend, spec Spec, start backends.SandboxSpec) (backends.Session, error) {
	// A pooled sandbox has no egress session of its own to carry.
	if pooler, ok := b.(backends.Pooler); ok && len(start.ExtraMounts) == 0 && !start.Network.Egress() && canClaim(b, start) {
		if name := p.poolFor(b, spec); name != "" {
			if info, ok := p.take(name); ok {
				claimed, err := pooler.Claim(ctx, info, start)
				if err == nil {
					p.counters.poolHits.Add(1)
					return claimed, nil
				}
				p.log.Warn().Err(err).Str("pool", name).Msg("cannot claim pooled sandbox; starting one")
				_ = b.StopSession(context.WithoutCancel(ctx), info)
			}
			p.counters.poolMisses.Add(1)
		}
	}
	return b.StartSession(ctx, start)
}

// canClaim asks a ClaimChecker whether a pooled sandbox can serve start.
func canClaim(b backends.Backend, start backends.SandboxSpec) bool {
	cc, ok := b.(backends.ClaimChecker)
	return !ok || cc.CanClaim(start)
}

func (p *warmPools) take(name string) (backends.Session, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ready := p.ready[name]
	if len(ready) == 0 {
		return backends.Session{}, false
	}
	info := ready[0]
	p.ready[name] = ready[1:]
	p.lastTake[name] = time.Now()
	return info, true
}

// loop keeps the pools filled until ctx ends. It checks every
// poolTick while the configuration has a pool, and otherwise sleeps until
// the configuration changes: a boxrt without pools does not wake up for
// them.
func (p *warmPools) loop(ctx context.Context) {
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for {
		p.fill(ctx)
		tick := t.C
		if len(p.settings.get().Durable.Pools) == 0 {
			tick = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-tick:
		case <-p.kicked:
		}
	}
}

// fill starts at most one sandbox per pool that is short and whose
// refill interval has passed, and drains pools the configuration no longer
// has (or shrank).
func (p *warmPools) fill(ctx context.Context) {
	b := p.backends.current()
	if b == nil || p.life.shuttingDown() {
		return
	}
	if _, ok := b.(backends.Pooler); !ok {
		return
	}
	want := map[string]PoolConfig{}
	for _, pc := range p.settings.get().Durable.Pools {
		if pc.Backend == "" || pc.Backend == b.Name() {
			want[pc.Name] = pc
		}
	}
	p.mu.Lock()
	var extra []backends.Session
	for name, ready := range p.ready {
		if n := want[name].Size; len(ready) > n {
			extra = append(extra, ready[n:]...)
			p.ready[name] = ready[:n]
		}
	}
	var todo []PoolConfig
	now := time.Now()
	for name, pc := range want {
		short := len(p.ready[name])+p.starting[name] < pc.Size
		rested := now.Sub(p.lastTake[name]) >= max(time.Duration(pc.RefillIntervalMS)*time.Millisecond, refillQuiet)
		if short && rested && p.starting[name] == 0 {
			p.starting[name]++
			p.seq++
			todo = append(todo, pc)
		}
	}
	seq := p.seq
	p.mu.Unlock()
	for _, info := range extra {
		_ = b.StopSession(context.WithoutCancel(ctx), info)
	}
	var wg sync.WaitGroup
	for i, pc := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.fillOne(ctx, b, pc, fmt.Sprintf("%s%s-%d", PoolSessionPrefix, pc.Name, seq-i))
		}()
	}
	wg.Wait()
}

// fillOne starts one sandbox for pool pc; one that comes back after the
// runtime began shutting down is stopped at once.
func (p *warmPools) fillOne(ctx context.Context, b backends.Backend, pc PoolConfig, id string) {
	defer func() {
		p.mu.Lock()
		p.starting[pc.Name]--
		p.mu.Unlock()
	}()
	sb, err := pc.sandbox()
	if err != nil {
		return
	}
	if sb.Image == "" {
		sb.Image = b.DefaultImage()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	info, err := b.StartSession(sctx, backends.SandboxSpec{SessionID: id, Sandbox: sb})
	cancel()
	if err != nil {
		p.log.Warn().Err(err).Str("pool", pc.Name).Msg("cannot start a pooled sandbox")
		return
	}
	// One exec warms what a sandbox's first exec would otherwise pay for
	// (bwrap: mounting its disk, making its cgroup), so the session that
	// takes it runs at warm-exec speed.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	_, err = b.Exec(wctx, info, backends.ExecRequest{Cmd: "true", Workdir: sb.MountPath, Timeout: 30 * time.Second,
		Stdout: io.Discard, Stderr: io.Discard})
	cancel()
	if err != nil {
		p.log.Warn().Err(err).Str("pool", pc.Name).Msg("a pooled sandbox failed its warm-up exec")
		_ = b.StopSession(context.WithoutCancel(ctx), info)
		return
	}
	if ep, ok := b.(backends.ExecPrestarter); ok {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		if err := ep.PrestartExec(pctx, info); err != nil {
			// The sandbox still serves, at warm-exec speed.
			p.log.Warn().Err(err).Str("pool", pc.Name).Msg("cannot prestart a pooled sandbox's first exec")
		}
		cancel()
	}
	// A box_init may have replaced b meanwhile: its sandboxes are no
	// longer reachable through the pool.
	if p.life.shuttingDown() || p.backends.current() != b || ctx.Err() != nil {
		_ = b.StopSession(context.WithoutCancel(ctx), info)
		return
	}
	p.mu.Lock()
	p.ready[pc.Name] = append(p.ready[pc.Name], info)
	p.mu.Unlock()
}

// drain stops every ready pooled sandbox of b (at exit, or when b is
// replaced).
func (p *warmPools) drain(ctx context.Context, b backends.Backend) {
	p.mu.Lock()
	var all []backends.Session
	for name, ready := range p.ready {
		all = append(all, ready...)
		delete(p.ready, name)
	}
	p.mu.Unlock()
	if b == nil {
		return
	}
	killSandboxes(ctx, b, all)
	eachBounded(all, func(info backends.Session) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		_ = b.StopSession(sctx, info)
		cancel()
	})
}

// PoolStatus is one pool in box_status.
type PoolStatus struct {
	Name  string `json:"name"`
	Ready int    `json:"ready"`
	Size  int    `json:"size"`
}

// status reports the configured pools.
func (p *warmPools) status(cfg Durable) []PoolStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PoolStatus, 0, len(cfg.Pools))
	for _, pc := range cfg.Pools {
		out = append(out, PoolStatus{Name: pc.Name, Ready: len(p.ready[pc.Name]), Size: pc.Size})
	}
	return out
}
