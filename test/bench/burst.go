package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// burstStats collects the burst scenario's numbers over repetitions.
type burstStats struct {
	exec       *Measure
	rssBefore  []float64 // KiB
	rssPeak    []float64 // VmHWM over the burst (KiB)
	rssSampled []float64 // highest VmRSS sampled every 20 ms (KiB)
	rssAfter   []float64 // right after the last answer (KiB)
	rssIdle    []float64 // after the idle wait (KiB)
	idleCPU    []float64 // CPU time used over the idle wait (ms)
	idleSwitch []float64 // context switches over the idle wait
	notes      []string
}

// burstCmd prints about 9 KB and holds its session half a second, so the
// execs really overlap (each session runs its execs one at a time).
const burstCmd = "seq 1 2000; sleep 0.5"

// burstParams is one burst case's shape.
type burstParams struct {
	sessions, execs, inFlight, reps int
	idle                            time.Duration
}

// Goals of the 64-on-64 case: boxrt's RSS peak while 64 execs run at once
// on 64 sessions, and what it comes back to after 30 s idle.
const (
	burst64PeakKiB = 64 << 10
	burst64IdleKiB = 32 << 10
)

func (b *bench) scenarioBurst(ctx context.Context) *Scenario {
	cfg := b.cfg
	return b.burstScenario(ctx, burstParams{sessions: cfg.burstSessions, execs: cfg.burstExecs, inFlight: cfg.burstInFlight,
		reps: cfg.burstReps, idle: cfg.burstIdle}, false)
}

// scenarioBurst64 is the burst with 64 execs in flight, one on each of 64
// sessions: every command runs at once.
func (b *bench) scenarioBurst64(ctx context.Context) *Scenario {
	cfg := b.cfg
	return b.burstScenario(ctx, burstParams{sessions: 64, execs: 64, inFlight: 64, reps: cfg.burstReps, idle: cfg.burstIdle}, true)
}

func (b *bench) burstScenario(ctx context.Context, cfg burstParams, goals bool) *Scenario {
	sc := &Scenario{Title: fmt.Sprintf("Memory: a burst of %d execs over %d bwrap sessions, %d in flight", cfg.execs, cfg.sessions, cfg.inFlight)}
	sc.Intro = fmt.Sprintf(`Per run, a fresh boxrt (stdio, bwrap backend, default limits: max_output_bytes 1 MiB per stream) creates %d sessions,
then %d callers send %d `+"`box_exec {\"cmd\":%q}`"+` calls round-robin over the sessions (%d in flight: the
per-connection bound; a session runs its execs one at a time, so at most %d commands run at once). boxrt's memory is read
from /proc/<pid>/status: VmRSS before the burst; **peak** = VmHWM, the kernel's high-water mark, reset just before
the burst (clear_refs); VmRSS right after the last answer; and VmRSS after %s with nothing to do, which shows whether
the burst's memory goes back to the system. The sessions are deleted at the end.`,
		cfg.sessions, cfg.inFlight, cfg.execs, burstCmd, cfg.inFlight, min(cfg.sessions, cfg.inFlight), cfg.idle)

	st := &burstStats{exec: newMeasure(fmt.Sprintf("boxrt bwrap: box_exec, %d in flight over %d sessions", cfg.inFlight, cfg.sessions))}
	sc.Extra = []*Measure{st.exec}
	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		b.burstRun(ctx, cfg, st, rep)
		b.logf("burst rep %d: RSS before %s, peak %s, after %s, after %s idle %s", rep+1, fmtKiB(last(st.rssBefore)),
			fmtKiB(last(st.rssPeak)), fmtKiB(last(st.rssAfter)), cfg.idle, fmtKiB(last(st.rssIdle)))
	}

	var t strings.Builder
	t.WriteString("| metric | boxrt bwrap |\n|---|---:|\n")
	row := func(name, v string) { fmt.Fprintf(&t, "| %s | %s |\n", name, v) }
	row("exec p50 / p99 (as a caller sees it, queueing included)", cell(st.exec, func(m *Measure) string { return fmtDur(m.P50()) + " / " + fmtDur(m.P99()) }))
	row("execs per second over the burst", cell(st.exec, func(m *Measure) string { return fmtOps(m.OpsPerSec()) }))
	row(fmt.Sprintf("boxrt RSS with %d idle sessions, before the burst", cfg.sessions), fmtKiB(median(st.rssBefore)))
	row("**boxrt RSS peak during the burst (VmHWM)**", "**"+fmtKiB(median(st.rssPeak))+"**")
	row("highest VmRSS sampled every 20 ms", fmtKiB(median(st.rssSampled)))
	row("boxrt RSS right after the burst", fmtKiB(median(st.rssAfter)))
	row(fmt.Sprintf("**boxrt RSS after %s idle**", cfg.idle), "**"+fmtKiB(median(st.rssIdle))+"**")
	if len(st.idleCPU) > 0 {
		row(fmt.Sprintf("boxrt CPU time over those %s idle (user + system) / context switches", cfg.idle),
			fmt.Sprintf("%.0f ms / %.0f", median(st.idleCPU), median(st.idleSwitch)))
	}
	sc.Tables = append(sc.Tables, t.String())
	sc.Notes = append(sc.Notes, fmt.Sprintf("Medians over %d run(s). RSS is boxrt's own (bwrap and the commands are other processes). "+
		"Before this release each exec reserved its full output cap up front (1 MiB × 2 streams); buffers now grow with the output.", cfg.reps))
	if goals {
		sc.Goals = burst64Goals(st, cfg.idle)
		sc.Breakdown = whereTimeGoesBurst64
	}
	sc.Notes = append(sc.Notes, st.notes...)
	return sc
}

// burst64Goals words the 64-on-64 case's memory goals.
func burst64Goals(st *burstStats, idle time.Duration) []Goal {
	peak := Goal{Text: fmt.Sprintf("64 concurrent box_exec on 64 bwrap sessions: boxrt RSS peak ≤ %s", fmtKiB(burst64PeakKiB))}
	back := Goal{Text: fmt.Sprintf("… and back under %s within 30 s idle", fmtKiB(burst64IdleKiB))}
	if len(st.rssPeak) == 0 {
		peak.Measured, back.Measured = "not measured", "not measured"
		return []Goal{peak, back}
	}
	p, i := median(st.rssPeak), median(st.rssIdle)
	peak.Measured = fmt.Sprintf("VmHWM %s (before the burst %s)", fmtKiB(p), fmtKiB(median(st.rssBefore)))
	peak.Met = boolp(p <= burst64PeakKiB)
	back.Measured = fmt.Sprintf("VmRSS %s after %s idle", fmtKiB(i), idle)
	back.Met = boolp(i < burst64IdleKiB && idle <= 30*time.Second)
	return []Goal{peak, back}
}

// burstRun is one run of a burst case.
func (b *bench) burstRun(ctx context.Context, cfg burstParams, st *burstStats, rep int) {
	limits := map[string]any{"max_sessions": max(64, cfg.sessions), "session_ttl_sec": 3600}
	p, err := b.startBackend(ctx, "burst", "bwrap", false, limits)
	if err != nil {
		st.exec.Unavailable = err.Error()
		return
	}
	defer p.stop(60 * time.Second)

	ids := make([]string, cfg.sessions)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-burst-%d-%03d", rep, i)
	}
	var created []string
	for _, id := range ids {
		if _, err := p.rpc.Call(ctx, "box_create_session", map[string]any{"session_id": id}); err != nil {
			st.exec.fail(fmt.Errorf("create %s: %w", id, err))
			continue
		}
		created = append(created, id)
	}
	defer func() {
		for _, id := range created {
			dctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			_ = deleteSession(dctx, p.rpc, id)
			cancel()
		}
	}()
	if len(created) == 0 {
		return
	}
	time.Sleep(time.Second)
	pid := p.pid()
	before, err := rssKiB(pid)
	if err != nil {
		st.exec.fail(err)
		return
	}
	// Reset VmHWM so the peak is the burst's, not boxrt's start's.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		st.notes = append(st.notes, fmt.Sprintf("run %d: could not reset VmHWM (%v): the peak includes boxrt's start", rep+1, err))
	}

	// Sample VmRSS while the burst runs.
	var sampled atomic.Int64
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, err := rssKiB(pid); err == nil && v > sampled.Load() {
				sampled.Store(v)
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()

	var next, busyRetries atomic.Int64
	var mu sync.Mutex
	var samples []time.Duration
	var wg sync.WaitGroup
	t0 := time.Now()
	for range cfg.inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= cfg.execs {
					return
				}
				s := time.Now()
				r, err := boxExec(ctx, p.rpc, created[i%len(created)], burstCmd)
				// boxrt frees a request's slot just after writing its
				// answer, so a caller that sends at once can find all 128
				// still taken: that answer is "busy", and the call is
				// sent again, as a host would.
				for err != nil && isBusy(err) && ctx.Err() == nil {
					busyRetries.Add(1)
					time.Sleep(2 * time.Millisecond)
					r, err = boxExec(ctx, p.rpc, created[i%len(created)], burstCmd)
				}
				d := time.Since(s)
				if err == nil && !strings.HasSuffix(r.Stdout, "\n2000\n") {
					err = errors.New("unexpected stdout: " + truncate(r.Stdout, 100))
				}
				mu.Lock()
				if err != nil {
					st.exec.fail(err)
				} else {
					samples = append(samples, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	close(stopSampling)
	sampler.Wait()
	if len(samples) > 0 {
		st.exec.add(summarise(samples, wall))
	}
	if n := busyRetries.Load(); n > 0 {
		st.notes = append(st.notes, fmt.Sprintf("run %d: %d call(s) were answered busy (all %d slots taken for an instant) and sent again", rep+1, n, cfg.inFlight))
	}
	after, _ := rssKiB(pid)
	peak, _ := statusKiB(pid, "VmHWM:")
	cpu0, sw0, cpuErr := procCPU(pid)

	select {
	case <-time.After(cfg.idle):
	case <-ctx.Done():
		return
	}
	idle, err := rssKiB(pid)
	if err != nil {
		st.exec.fail(err)
		return
	}
	st.rssBefore = append(st.rssBefore, float64(before))
	st.rssPeak = append(st.rssPeak, float64(peak))
	st.rssSampled = append(st.rssSampled, float64(sampled.Load()))
	st.rssAfter = append(st.rssAfter, float64(after))
	st.rssIdle = append(st.rssIdle, float64(idle))
	if cpu1, sw1, err := procCPU(pid); err == nil && cpuErr == nil {
		st.idleCPU = append(st.idleCPU, float64((cpu1 - cpu0).Milliseconds()))
		st.idleSwitch = append(st.idleSwitch, float64(sw1-sw0))
	}
}

// procCPU is the CPU time pid has used (user and system, at the kernel's
// 10 ms tick) and the context switches of all its threads.
func procCPU(pid int) (time.Duration, int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name, which may hold spaces: state is
	// the first, utime the 12th, stime the 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, err
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var switches int64
	for _, t := range tasks {
		status, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		for _, key := range []string{"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"} {
			if n, err := statusValue(status, key); err == nil {
				switches += n
			}
		}
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, switches, nil
}

// statusKiB reads one "Name: N kB" line of /proc/<pid>/status.
func statusKiB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return statusValue(b, key)
}

// statusValue is the number of one "Name: N ..." line of a status file.
func statusValue(status []byte, key string) (int64, error) {
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s line", key)
}

// isBusy reports boxrt's answer to a request over the in-flight bound.
func isBusy(err error) bool {
	var re *rpcError
	return errors.As(err, &re) && re.Code == -32002 && strings.Contains(re.Message, "busy")
}
