package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// scaleStats collects one backend's scale numbers over repetitions.
type scaleStats struct {
	backend   string
	n         int
	create    *Measure // box_create_session, concurrent callers
	exec      *Measure // box_exec true on each session, sequential
	list      *Measure // box_get_sessions with n sessions
	status    *Measure // box_status with n sessions
	rssBefore []float64
	rssAfter  []float64
	rssReaped []float64
	perSess   []float64 // KiB per session
	// pssPerIdle is the host memory (PSS of boxrt and every process
	// below it) per idle session, KiB, at densitySessions sessions
	pssPerIdle []float64
	// pssReleased is the same once bwrap's idle release stopped the idle
	// sessions' sandboxes (densityRun), KiB
	pssReleased []float64
	reapFirst   []float64 // seconds from lowering the TTL to the first session gone
	reapAll     []float64 // seconds from lowering the TTL to none left
	reapRate    []float64 // sessions destroyed per second by the reaper
	flat        flatStats
	notes       []string
}

func (b *bench) scenarioScale(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: fmt.Sprintf("Scale: %d docker sessions, %d bwrap sessions", cfg.scaleDocker, cfg.scaleBwrap)}
	sc.Intro = fmt.Sprintf(`Per run and backend, a fresh boxrt (stdio; limits.max_sessions 5000, session_ttl_sec 3600; bwrap.idle_release_sec 0, so every
bwrap sandbox stays running) first creates, execs
and deletes one warm-up session — timing first, with no other session, %d `+"`box_exec true`"+` on it and %d new sessions'
first output (`+"`box_exec echo hi`"+` on a new id, deleted untimed) — then:
1. creates N sessions with `+"`box_create_session`"+` from %d concurrent callers (create rate = N ÷ wall time), pausing
   after the first %d for 1 s to sum the PSS of boxrt and every process below it (its sandboxes and their agents):
   host memory per idle session = the growth ÷ those sessions;
2. runs `+"`box_exec true`"+` once in every session, sequentially (exec p50/p99 with N sessions alive), then times %d
   `+"`box_exec true`"+` on the first of them and %d new sessions' first output again (the flatness rows compare both
   sides, in the same boxrt); on docker, each new session is followed by a container of the engine alone (Engine API, no
   boxrt: a session's hardening and limits, two anonymous volumes, created and started until its `+"`echo hi`"+` is
   read), so the engine's own growth with N containers shows beside boxrt's, measured at the same moments;
3. reads boxrt's VmRSS from /proc/<pid>/status before step 1 and after step 2 (RSS per session = growth ÷ N);
4. times 20 `+"`box_get_sessions`"+` (lists all N) and 20 `+"`box_status`"+` calls;
5. **reaper**: waits 1.2 s so every session has been idle over 1 s, lowers the TTL with `+"`box_init {\"limits\":{\"session_ttl_sec\":1}}`"+`
   (which restarts the reaper with a 1 s period), and polls `+"`box_status`"+` every 10 ms until no session is left.
   The in-memory scan that picks idle sessions is a loop over a map — microseconds, not observable from outside the
   process — so the honest externally visible measures are: time from lowering the TTL to the first session gone
   (≈ the 1 s tick + the scan + one teardown), to the last one gone (the whole reap pass: the reaper tears sessions down
   one after another), and the resulting teardown rate. `+"`box_get_sessions`"+`/`+"`box_status`"+` latency shows what a
   full walk of the session table costs at this size.
Everything is deleted at the end (the reaper does it; any leftover is deleted explicitly) and the run checks that no
container of this boxrt instance is left (`+"`docker ps -a --filter label=boxrt.instance=<id>`"+`).
On bwrap a second fresh boxrt with `+"`bwrap.idle_release_sec`"+` %d creates %d sessions, leaves them idle past that (their
sandboxes are released: stopped, files kept) and sums the PSS again: host memory per idle session once released.
The scale scenario runs %d time(s); the numbers are medians over runs.`, flatSamples*5, flatSamples, cfg.scaleConc, densitySessions, flatSamples*5, flatSamples, densityIdleSec, densitySessions, cfg.scaleReps)

	backends := []*scaleStats{
		{backend: "docker", n: cfg.scaleDocker},
		{backend: "bwrap", n: cfg.scaleBwrap},
	}
	for _, s := range backends {
		s.create = newMeasure(fmt.Sprintf("boxrt %s: box_create_session ×%d", s.backend, s.n))
		s.exec = newMeasure(fmt.Sprintf("boxrt %s: exec `true` with %d sessions", s.backend, s.n))
		s.list = newMeasure(fmt.Sprintf("boxrt %s: box_get_sessions at %d", s.backend, s.n))
		s.status = newMeasure(fmt.Sprintf("boxrt %s: box_status at %d", s.backend, s.n))
		s.flat = newFlatStats(s.backend, s.n)
		sc.Extra = append(sc.Extra, s.create, s.exec, s.list, s.status)
	}
	for rep := 0; rep < cfg.scaleReps && ctx.Err() == nil; rep++ {
		for _, s := range backends {
			if s.n <= 0 || s.create.Unavailable != "" {
				continue
			}
			b.scaleRun(ctx, s, rep)
			if s.backend == "bwrap" {
				b.densityRun(ctx, s, rep)
			}
			b.logf("scale %s rep %d: create %s/s, exec p50 %s, RSS/session %s, reap all %s", s.backend, rep+1,
				lastOps(s.create), lastP50(s.exec), fmtKiB(last(s.perSess)), fmtSec(last(s.reapAll)))
		}
	}

	// the same calls with one session alive and with N, in one boxrt
	for _, s := range backends {
		sc.Rows = append(sc.Rows, flatRows(s)...)
	}

	sc.Goals = append(flatGoals(backends[1]), flatGoals(backends[0])...)
	sc.Goals = append(sc.Goals, densityGoal(backends[1]))

	var t strings.Builder
	t.WriteString("| metric | " + fmt.Sprintf("docker (%d sessions)", cfg.scaleDocker) + " | " + fmt.Sprintf("bwrap (%d sessions)", cfg.scaleBwrap) + " |\n|---|---:|---:|\n")
	row := func(name string, f func(s *scaleStats) string) {
		fmt.Fprintf(&t, "| %s | %s | %s |\n", name, f(backends[0]), f(backends[1]))
	}
	row(fmt.Sprintf("sessions created per second (%d concurrent callers)", cfg.scaleConc), func(s *scaleStats) string {
		return cell(s.create, func(m *Measure) string { return fmtOps(m.OpsPerSec()) })
	})
	row("box_create_session p50 / p99", func(s *scaleStats) string {
		return cell(s.create, func(m *Measure) string { return fmtDur(m.P50()) + " / " + fmtDur(m.P99()) })
	})
	row("exec `true` p50 / p99 with all sessions alive", func(s *scaleStats) string {
		return cell(s.exec, func(m *Measure) string { return fmtDur(m.P50()) + " / " + fmtDur(m.P99()) })
	})
	row("exec `true` p50 with 1 session, calls back to back (same boxrt, before the others)", func(s *scaleStats) string {
		return cell(s.flat.exec1, func(m *Measure) string { return fmtDur(m.P50()) })
	})
	row("boxrt RSS before → after creating and exec'ing", func(s *scaleStats) string {
		if len(s.rssBefore) == 0 {
			return "n/a"
		}
		return fmtKiB(median(s.rssBefore)) + " → " + fmtKiB(median(s.rssAfter))
	})
	row("**boxrt RSS per session**", func(s *scaleStats) string { return "**" + fmtKiB(median(s.perSess)) + "**" })
	row(fmt.Sprintf("host memory per idle session, measured after the first %d (PSS of boxrt and its sandboxes)", densitySessions), func(s *scaleStats) string {
		if len(s.pssPerIdle) == 0 {
			return "n/a"
		}
		return fmtKiB(median(s.pssPerIdle))
	})
	row(fmt.Sprintf("host memory per idle session at %d, once idle sandboxes are released (bwrap.idle_release_sec %d)", densitySessions, densityIdleSec), func(s *scaleStats) string {
		if len(s.pssReleased) == 0 {
			return "n/a"
		}
		return fmtKiB(median(s.pssReleased))
	})
	row("box_get_sessions p50 (lists every session)", func(s *scaleStats) string {
		return cell(s.list, func(m *Measure) string { return fmtDur(m.P50()) })
	})
	row("box_status p50 (walks the session table)", func(s *scaleStats) string {
		return cell(s.status, func(m *Measure) string { return fmtDur(m.P50()) })
	})
	row("reaper: TTL lowered → first session gone", func(s *scaleStats) string { return fmtSec(median(s.reapFirst)) })
	row("reaper: TTL lowered → all sessions gone", func(s *scaleStats) string { return fmtSec(median(s.reapAll)) })
	row("reaper: sessions torn down per second", func(s *scaleStats) string { return fmtRate(median(s.reapRate)) })
	row("boxrt RSS after reaping", func(s *scaleStats) string { return fmtKiB(median(s.rssReaped)) })
	sc.Tables = append(sc.Tables, t.String())
	sc.Notes = append(sc.Notes, "RSS is VmRSS as the kernel reports it for the boxrt process alone (containers, bwrap processes and dockerd are not in it). "+
		"A Go heap grows in steps and the garbage collector runs when it likes, so the per-session figure is rough: trust its order of magnitude, not its last digit.")
	for _, s := range backends {
		for _, n := range s.notes {
			sc.Notes = append(sc.Notes, s.backend+": "+n)
		}
	}
	sc.Breakdown = whereTimeGoesScale
	return sc
}

func last(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[len(v)-1]
}

func fmtKiB(kib float64) string {
	switch {
	case kib != kib || kib == 0:
		return "n/a"
	case kib >= 10*1024 || kib <= -10*1024:
		return fmt.Sprintf("%.1f MiB", kib/1024)
	default:
		return fmt.Sprintf("%.1f KiB", kib)
	}
}

func fmtSec(s float64) string {
	if s != s || s <= 0 {
		return "n/a"
	}
	return fmtDur(time.Duration(s * float64(time.Second)))
}

func fmtRate(v float64) string {
	if v != v || v <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f /s", v)
}

// scaleRun is one run of the scale scenario for one backend.
// densitySessions is how many idle sessions the host memory per session
// is measured at (issue 37's density goal).
const densitySessions = 200

// createSessions creates ids with box_create_session from the scenario's
// concurrent callers and returns each call's latency, the ids created and
// the wall time; failures are recorded on s.create.
func (b *bench) createSessions(ctx context.Context, p *boxrtProc, s *scaleStats, ids []string) (samples []time.Duration, created []string, wall time.Duration) {
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < max(1, b.cfg.scaleConc); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(ids) {
					return
				}
				st := time.Now()
				_, err := p.rpc.Call(ctx, "box_create_session", map[string]any{"session_id": ids[i]})
				d := time.Since(st)
				mu.Lock()
				if err != nil {
					s.create.fail(err)
				} else {
					samples = append(samples, d)
					created = append(created, ids[i])
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return samples, created, time.Since(t0)
}

func (b *bench) scaleRun(ctx context.Context, s *scaleStats, rep int) {
	limits := map[string]any{"max_sessions": 5000, "session_ttl_sec": 3600}
	conf := map[string]any{"backend": s.backend, "limits": limits}
	switch s.backend {
	case "docker":
		conf["docker"] = map[string]any{"image": b.cfg.image}
	case "bwrap":
		// Every sandbox stays running, so the exec rows enter N running
		// sandboxes (densityRun measures released ones).
		conf["bwrap"] = map[string]any{"idle_release_sec": 0}
	}
	raw, _ := json.Marshal(conf)
	p, err := b.startBoxrt(ctx, boxrtOpts{Name: "scale-" + s.backend, Stdio: true, Config: string(raw)})
	if err == nil {
		err = b.checkBackend(ctx, p, s.backend)
	}
	if err != nil {
		s.create.Unavailable = err.Error()
		s.exec.Unavailable, s.list.Unavailable, s.status.Unavailable = err.Error(), err.Error(), err.Error()
		return
	}
	defer p.stop(60 * time.Second)
	prefix := fmt.Sprintf("bench-scale-%s-%d-", s.backend, rep)

	var eng *engineNew
	if s.flat.engine1 != nil {
		if cli, err := newDockerClient(); err != nil {
			s.flat.engine1.Unavailable, s.flat.engineN.Unavailable = err.Error(), err.Error()
		} else {
			defer cli.Close()
			eng = &engineNew{cli: cli, image: b.cfg.image, label: b.token, samples: map[*Measure][]time.Duration{}}
		}
	}

	// warm-up session: loads every code path once; then the one-session
	// side of the flatness rows
	if _, err := boxExec(ctx, p.rpc, prefix+"warm", "true"); err != nil {
		s.create.fail(fmt.Errorf("warm-up: %w", err))
		return
	}
	s.flat.before(ctx, p, prefix+"warm", prefix, eng)
	if err := deleteSession(ctx, p.rpc, prefix+"warm"); err != nil {
		s.create.fail(fmt.Errorf("warm-up delete: %w", err))
	}
	time.Sleep(time.Second)
	rss0, _ := rssKiB(p.pid())

	// 1. create, measuring what idle sessions cost the host on the way
	ids := make([]string, s.n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	pss0, _, pssErr := sessionPSSKiB(p.pid())
	k := min(densitySessions, len(ids))
	samples, created, wall := b.createSessions(ctx, p, s, ids[:k])
	time.Sleep(time.Second)
	if pss1, procs, err := sessionPSSKiB(p.pid()); err == nil && pssErr == nil && len(created) > 0 {
		s.pssPerIdle = append(s.pssPerIdle, float64(pss1-pss0)/float64(len(created)))
		s.notes = append(s.notes, fmt.Sprintf("run %d: %d idle sessions: boxrt and %d processes below it, PSS %s → %s",
			rep+1, len(created), procs-1, fmtKiB(float64(pss0)), fmtKiB(float64(pss1))))
	}
	more, moreCreated, moreWall := b.createSessions(ctx, p, s, ids[k:])
	samples, created, wall = append(samples, more...), append(created, moreCreated...), wall+moreWall
	if len(samples) > 0 {
		s.create.add(summarise(samples, wall))
	}

	// 2. exec in each
	timeOps(ctx, s.exec, len(created), func(i int) error {
		_, err := boxExec(ctx, p.rpc, created[i], "true")
		return err
	})

	if len(created) > 0 {
		s.flat.after(ctx, p, created[0], prefix, eng)
	}

	// 3. memory
	rss1, err := rssKiB(p.pid())
	if err == nil && rss0 > 0 && len(created) > 0 {
		s.rssBefore = append(s.rssBefore, float64(rss0))
		s.rssAfter = append(s.rssAfter, float64(rss1))
		s.perSess = append(s.perSess, float64(rss1-rss0)/float64(len(created)))
	}

	// 4. table walks
	var listed int
	timeOps(ctx, s.list, 20, func(int) error {
		var r struct {
			Sessions []struct {
				SessionID string `json:"session_id"`
			} `json:"sessions"`
		}
		if err := p.rpc.CallInto(ctx, "box_get_sessions", nil, &r); err != nil {
			return err
		}
		listed = len(r.Sessions)
		return nil
	})
	if listed != len(created) {
		s.notes = append(s.notes, fmt.Sprintf("run %d: box_get_sessions listed %d sessions, %d were created", rep+1, listed, len(created)))
	}
	timeOps(ctx, s.status, 20, func(int) error {
		_, err := p.rpc.Call(ctx, "box_status", nil)
		return err
	})

	// 5. reaper
	time.Sleep(1200 * time.Millisecond)
	active := func() (int, error) {
		var st struct {
			ActiveSessions int `json:"active_sessions"`
		}
		err := p.rpc.CallInto(ctx, "box_status", nil, &st)
		return st.ActiveSessions, err
	}
	startCount, err := active()
	if err != nil {
		s.notes = append(s.notes, "box_status failed: "+err.Error())
	}
	if _, err := p.rpc.Call(ctx, "box_init", map[string]any{"limits": map[string]any{"session_ttl_sec": 1}}); err != nil {
		s.notes = append(s.notes, fmt.Sprintf("run %d: box_init to lower the TTL failed (%v); reaper not measured", rep+1, err))
	} else {
		tInit := time.Now()
		deadline := tInit.Add(30*time.Second + time.Duration(s.n)*time.Second)
		var first, all time.Duration
		for time.Now().Before(deadline) && ctx.Err() == nil {
			n, err := active()
			if err != nil {
				break
			}
			if first == 0 && n < startCount {
				first = time.Since(tInit)
			}
			if n == 0 {
				all = time.Since(tInit)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if all > 0 {
			s.reapFirst = append(s.reapFirst, first.Seconds())
			s.reapAll = append(s.reapAll, all.Seconds())
			if all > first && startCount > 1 {
				s.reapRate = append(s.reapRate, float64(startCount-1)/(all-first).Seconds())
			}
		} else {
			s.notes = append(s.notes, fmt.Sprintf("run %d: the reaper had not removed every session after %s", rep+1, time.Since(tInit).Round(time.Second)))
		}
	}
	if rss, err := rssKiB(p.pid()); err == nil {
		s.rssReaped = append(s.rssReaped, float64(rss))
	}

	// leftovers: delete explicitly
	var left struct {
		Sessions []struct {
			SessionID string `json:"session_id"`
		} `json:"sessions"`
	}
	if err := p.rpc.CallInto(ctx, "box_get_sessions", nil, &left); err == nil && len(left.Sessions) > 0 {
		s.notes = append(s.notes, fmt.Sprintf("run %d: deleted %d leftover sessions explicitly", rep+1, len(left.Sessions)))
		var dwg sync.WaitGroup
		sem := make(chan struct{}, 4)
		for _, ss := range left.Sessions {
			dwg.Add(1)
			sem <- struct{}{}
			go func(id string) {
				defer dwg.Done()
				defer func() { <-sem }()
				dctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				_ = deleteSession(dctx, p.rpc, id)
			}(ss.SessionID)
		}
		dwg.Wait()
	}
}

// densityGoal is issue 37's: an idle bwrap session cheap for the host.
func densityGoal(bw *scaleStats) Goal {
	mem := Goal{Text: fmt.Sprintf("bwrap host memory per idle session at %d sessions (PSS of boxrt, bwrap and agent) ≤ 1 MiB", min(densitySessions, bw.n)), Measured: "not measured"}
	if len(bw.pssReleased) > 0 {
		v := median(bw.pssReleased)
		mem.Measured = fmt.Sprintf("%s once released (%s while the sandboxes run)", fmtKiB(v), fmtKiB(median(bw.pssPerIdle)))
		mem.Met = boolp(v <= 1024)
	}
	return mem
}

// densityIdleSec is the bwrap.idle_release_sec of densityRun: short, so
// that the run does not wait the default 30 s.
const densityIdleSec = 2

// densityRun measures bwrap's host memory per idle session at
// densitySessions sessions once their sandboxes were released for being
// idle: a boxrt of its own with a short bwrap.idle_release_sec, whose
// sessions then sit idle past it (the release scan runs every quarter of
// it).
func (b *bench) densityRun(ctx context.Context, s *scaleStats, rep int) {
	cfg := fmt.Sprintf(`{"backend":"bwrap","limits":{"max_sessions":5000,"session_ttl_sec":3600},"bwrap":{"idle_release_sec":%d}}`, densityIdleSec)
	p, err := b.startBoxrt(ctx, boxrtOpts{Name: "density-bwrap", Stdio: true, Config: cfg})
	if err != nil {
		s.notes = append(s.notes, fmt.Sprintf("run %d: density run not measured: %v", rep+1, err))
		return
	}
	defer p.stop(60 * time.Second)
	if err := b.checkBackend(ctx, p, "bwrap"); err != nil {
		s.notes = append(s.notes, fmt.Sprintf("run %d: density run not measured: %v", rep+1, err))
		return
	}
	prefix := fmt.Sprintf("bench-density-%d-", rep)
	if _, err := boxExec(ctx, p.rpc, prefix+"warm", "true"); err != nil {
		s.notes = append(s.notes, fmt.Sprintf("run %d: density warm-up: %v", rep+1, err))
		return
	}
	_ = deleteSession(ctx, p.rpc, prefix+"warm")
	time.Sleep(time.Second)
	pss0, _, err := sessionPSSKiB(p.pid())
	if err != nil {
		return
	}
	ids := make([]string, densitySessions)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	_, created, _ := b.createSessions(ctx, p, &scaleStats{create: newMeasure("density")}, ids)
	time.Sleep(time.Duration(densityIdleSec)*time.Second*3/2 + time.Second)
	if pss1, procs, err := sessionPSSKiB(p.pid()); err == nil && len(created) > 0 {
		s.pssReleased = append(s.pssReleased, float64(pss1-pss0)/float64(len(created)))
		s.notes = append(s.notes, fmt.Sprintf("run %d: %d sessions idle past bwrap.idle_release_sec %d: boxrt and %d processes below it, PSS %s → %s",
			rep+1, len(created), densityIdleSec, procs-1, fmtKiB(float64(pss0)), fmtKiB(float64(pss1))))
	}
	for _, id := range created {
		_ = deleteSession(ctx, p.rpc, id)
	}
}
