package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// scenarioDurable measures what durable sessions buy a host: a new
// session served from a warm pool, a suspended session's next exec, and a
// fork's first exec, each to the first output.
func (b *bench) scenarioDurable(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "Durable sessions: warm pool, resume, fork → first output"}
	n := map[string]int{"docker": cfg.coldNDocker, "bwrap": cfg.coldNBwrap * 2}
	sc.Intro = fmt.Sprintf(`Per run and backend (%d docker / %d bwrap samples each), one boxrt configured with a warm pool
`+"(`durable.pools: [{name: bench, size: 2}]`)"+`:
- *pool*: `+"`box_exec {\"cmd\":\"echo hi\"}`"+` on a new session id while the pool is full (the harness waits for the refill between samples, untimed);
- *cold*: the same with `+"`memory_mb: 256`"+`, which no pool fits (the baseline of the pool row);
- *resume*: `+"`box_suspend_session`"+` (untimed), then `+"`box_exec`"+` on it: resume plus the exec;
- *fork*: `+"`box_fork_session`"+` of a session holding a few files, then `+"`box_exec`"+` on the fork (timed together).
Sessions are deleted between samples, untimed.`, n["docker"], n["bwrap"])

	type set struct{ pool, cold, resume, fork *Measure }
	sets := map[string]set{}
	for _, backend := range []string{"docker", "bwrap"} {
		s := set{newMeasure("boxrt " + backend + ", new session from the pool"), newMeasure("boxrt " + backend + ", new session, cold"),
			newMeasure("boxrt " + backend + ", resume → first output"), newMeasure("boxrt " + backend + ", fork → first output")}
		sets[backend] = s
		sc.Rows = append(sc.Rows, Row{Case: backend + ": new session, warm pool vs cold", Boxrt: s.pool, Base: s.cold},
			Row{Case: backend + ": exec on a suspended session", Boxrt: s.resume, Base: s.cold},
			Row{Case: backend + ": fork + first exec", Boxrt: s.fork, Base: s.cold})
		if !b.wantBackend(backend) {
			for _, m := range []*Measure{s.pool, s.cold, s.resume, s.fork} {
				m.Unavailable = skippedBackend
			}
			continue
		}
		p, err := b.startDurable(ctx, backend)
		if err != nil {
			for _, m := range []*Measure{s.pool, s.cold, s.resume, s.fork} {
				m.Unavailable = err.Error()
			}
			continue
		}
		for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
			b.durableRun(ctx, p, backend, rep, n[backend], s.pool, s.cold, s.resume, s.fork)
			b.logf("durable %s rep %d: pool %s, cold %s, resume %s, fork %s", backend, rep+1,
				lastP50(s.pool), lastP50(s.cold), lastP50(s.resume), lastP50(s.fork))
		}
		p.stop(30 * time.Second)
	}
	for _, g := range []struct {
		backend string
		max     time.Duration
	}{{"bwrap", 15 * time.Millisecond}, {"docker", 70 * time.Millisecond}} {
		sc.Goals = append(sc.Goals, poolGoal(g.backend, sets[g.backend].pool, g.max))
	}
	sc.Breakdown = whereTimeGoesPool
	return sc
}

// poolGoal is the goal row of backend's warm pool: a pooled session's
// first output (p50 of m) within limit.
func poolGoal(backend string, m *Measure, limit time.Duration) Goal {
	goal := Goal{Text: fmt.Sprintf("%s new session → first output with a warm pool ≤ %s (p50)", backend, fmtDur(limit))}
	if m.ok() {
		goal.Measured = fmtDur(m.P50())
		goal.Met = boolp(m.P50() <= limit)
	} else {
		goal.Measured = "not measured"
	}
	return goal
}

// startDurable starts boxrt on backend with a warm pool of 2.
func (b *bench) startDurable(ctx context.Context, backend string) (*boxrtProc, error) {
	cfg := map[string]any{"backend": backend,
		"durable": map[string]any{"pools": []map[string]any{{"name": "bench", "size": 2}}}}
	if backend == "docker" {
		cfg["docker"] = map[string]any{"image": b.cfg.image}
	}
	raw, _ := json.Marshal(cfg)
	p, err := b.startBoxrt(ctx, boxrtOpts{Name: "durable-" + backend, Stdio: true, Config: string(raw)})
	if err != nil {
		return nil, err
	}
	var st struct {
		InstanceID string `json:"instance_id"`
	}
	if err := p.rpc.CallInto(ctx, "box_status", nil, &st); err != nil {
		p.stop(10 * time.Second)
		return nil, err
	}
	b.instances[st.InstanceID] = true
	return p, nil
}

// waitPool waits until the pool is full again.
func waitPool(ctx context.Context, p *boxrtProc) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var st struct {
			Pools []struct {
				Ready int `json:"ready"`
				Size  int `json:"size"`
			} `json:"pools"`
		}
		if err := p.rpc.CallInto(ctx, "box_status", nil, &st); err != nil {
			return err
		}
		if len(st.Pools) == 1 && st.Pools[0].Ready == st.Pools[0].Size {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("the warm pool did not refill within 2 minutes")
}

func (b *bench) durableRun(ctx context.Context, p *boxrtProc, backend string, rep, n int, pool, cold, resume, fork *Measure) {
	timed := func(m *Measure, setup func(i int) error, op func(i int) error, teardown func(i int)) {
		var samples []time.Duration
		var sum time.Duration
		for i := 0; i < n && ctx.Err() == nil; i++ {
			if err := setup(i); err != nil {
				m.fail(err)
				continue
			}
			s := time.Now()
			err := op(i)
			d := time.Since(s)
			teardown(i)
			if err != nil {
				m.fail(err)
				continue
			}
			samples, sum = append(samples, d), sum+d
		}
		if len(samples) > 0 {
			m.add(summarise(samples, sum))
		}
	}
	id := func(kind string, i int) string { return fmt.Sprintf("bench-%s-%s-%d-%d", kind, backend, rep, i) }
	echo := func(sid string, extra map[string]any) error {
		params := map[string]any{"session_id": sid, "cmd": "echo hi"}
		for k, v := range extra {
			params[k] = v
		}
		var r execResult
		if err := p.rpc.CallInto(ctx, "box_exec", params, &r); err != nil {
			return err
		}
		return expectOut(r.Stdout, "hi\n")
	}
	none := func(int) error { return nil }
	del := func(kind string) func(int) {
		return func(i int) { _ = deleteSession(ctx, p.rpc, id(kind, i)) }
	}

	timed(pool, func(int) error { return waitPool(ctx, p) }, func(i int) error { return echo(id("pool", i), nil) }, del("pool"))
	timed(cold, none, func(i int) error { return echo(id("cold", i), map[string]any{"memory_mb": 256}) }, del("cold"))
	timed(resume, func(i int) error {
		if err := echo(id("resume", i), map[string]any{"memory_mb": 256}); err != nil {
			return err
		}
		_, err := p.rpc.Call(ctx, "box_suspend_session", map[string]any{"session_id": id("resume", i)})
		return err
	}, func(i int) error { return echo(id("resume", i), map[string]any{"memory_mb": 256}) }, del("resume"))

	src := id("fork-src", 0)
	if _, err := boxExec(ctx, p.rpc, src, "mkdir -p /workspace/d && for i in 1 2 3 4 5 6 7 8; do echo $i > /workspace/d/f$i; done"); err != nil {
		fork.fail(err)
		return
	}
	defer func() { _ = deleteSession(ctx, p.rpc, src) }()
	timed(fork, none, func(i int) error {
		if _, err := p.rpc.Call(ctx, "box_fork_session", map[string]any{"session_id": src, "new_session_id": id("fork", i)}); err != nil {
			return err
		}
		return echo(id("fork", i), nil)
	}, del("fork"))
}
