package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// burstStats collects one burst case's numbers over repetitions.
type burstStats struct {
	exec       *Measure
	answered   []float64 // calls answered with their output, per run
	queueP99   []float64 // p99 of the time a call waited in boxrt's queue (ms)
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

// burstParams is one burst case's shape: execs sent at once, round-robin
// over sessions.
type burstParams struct {
	sessions, execs, reps int
	idle                  time.Duration
}

// Goals: boxrt's RSS peak during the large burst; for the 64-on-64 case,
// the peak and what it comes back to after 30 s idle.
const (
	burstPeakKiB   = 64 << 10
	burst64PeakKiB = 64 << 10
	burst64IdleKiB = 32 << 10
)

// scenarioBurst sends two bursts, each all at once on one connection, as
// a host fanning out tool calls: more calls than run at once, so the rest
// wait in boxrt's queue; every one must be answered.
func (b *bench) scenarioBurst(ctx context.Context) *Scenario {
	cfg := b.cfg
	cases := []burstParams{
		{sessions: cfg.burstSessions, execs: cfg.burstExecs, reps: cfg.burstReps, idle: cfg.burstSettle},
		{sessions: cfg.burstLargeSessions, execs: cfg.burstLargeExecs, reps: cfg.burstReps, idle: cfg.burstSettle},
	}
	sc := &Scenario{Title: fmt.Sprintf("Burst: %d and %d execs sent at once over %d and %d bwrap sessions",
		cases[0].execs, cases[1].execs, cases[0].sessions, cases[1].sessions)}
	sc.Intro = burstIntro(fmt.Sprintf("%d (or %d) sessions", cases[0].sessions, cases[1].sessions), "all the calls at once", cfg.burstSettle)
	stats := make([]*burstStats, len(cases))
	for i, c := range cases {
		stats[i] = b.burstCase(ctx, c)
		sc.Extra = append(sc.Extra, stats[i].exec)
		sc.Notes = append(sc.Notes, stats[i].notes...)
	}
	sc.Tables = append(sc.Tables, burstTable(cases, stats))
	sc.Goals = burstGoals(cases, stats)
	return sc
}

// scenarioBurst64 is the burst with 64 execs, one on each of 64 sessions:
// every command runs at once, nothing waits.
func (b *bench) scenarioBurst64(ctx context.Context) *Scenario {
	c := burstParams{sessions: 64, execs: 64, reps: b.cfg.burstReps, idle: b.cfg.burstIdle}
	sc := &Scenario{Title: "Memory: a burst of 64 execs over 64 bwrap sessions, all running at once"}
	sc.Intro = burstIntro("64 sessions", "64 calls at once, one per session", c.idle)
	st := b.burstCase(ctx, c)
	sc.Extra = []*Measure{st.exec}
	sc.Tables = append(sc.Tables, burstTable([]burstParams{c}, []*burstStats{st}))
	sc.Goals = burst64Goals(st, c.idle)
	sc.Breakdown = whereTimeGoesBurst64
	sc.Notes = append(sc.Notes, st.notes...)
	return sc
}

func burstIntro(sessions, calls string, idle time.Duration) string {
	return fmt.Sprintf(`Per case, a fresh boxrt (stdio, bwrap backend, bwrap.idle_release_sec 0 so every sandbox is running when the burst
comes, default max_output_bytes: 1 MiB per stream) creates %s,
then the host sends %s on its one connection, `+"`box_exec {\"cmd\":%q}`"+` round-robin over the sessions. boxrt runs 128
at once (4 of one session), the others wait in the connection's queue; a session runs its execs one at a time.
**queue wait** is boxrt's own (its log's queued_ms per call, 0 for a call that ran at once). boxrt's memory is read
from /proc/<pid>/status: VmRSS before the burst; **peak** = VmHWM, the kernel's high-water mark, reset just before
the burst (clear_refs); VmRSS right after the last answer; and VmRSS after %s with nothing to do. The sessions are
deleted at the end.`, sessions, calls, burstCmd, idle)
}

func burstTable(cases []burstParams, stats []*burstStats) string {
	var t strings.Builder
	t.WriteString("| metric |")
	for _, c := range cases {
		fmt.Fprintf(&t, " %d over %d |", c.execs, c.sessions)
	}
	t.WriteString("\n|---|" + strings.Repeat("---:|", len(cases)) + "\n")
	row := func(name string, v func(*burstStats) string) {
		fmt.Fprintf(&t, "| %s |", name)
		for _, st := range stats {
			fmt.Fprintf(&t, " %s |", v(st))
		}
		t.WriteString("\n")
	}
	fmt.Fprintf(&t, "| **answered with their output** |")
	for i, st := range stats {
		fmt.Fprintf(&t, " **%.0f / %d** |", median(st.answered), cases[i].execs)
	}
	t.WriteString("\n")
	row("exec p50 / p99 (as the host sees it, queueing included)", func(st *burstStats) string {
		return cell(st.exec, func(m *Measure) string { return fmtDur(m.P50()) + " / " + fmtDur(m.P99()) })
	})
	row("**queue wait p99** (boxrt's)", func(st *burstStats) string { return fmt.Sprintf("**%.0f ms**", median(st.queueP99)) })
	row("execs per second over the burst", func(st *burstStats) string {
		return cell(st.exec, func(m *Measure) string { return fmtOps(m.OpsPerSec()) })
	})
	row("boxrt RSS with the idle sessions, before the burst", func(st *burstStats) string { return fmtKiB(median(st.rssBefore)) })
	row("**boxrt RSS peak during the burst (VmHWM)**", func(st *burstStats) string { return "**" + fmtKiB(median(st.rssPeak)) + "**" })
	row("highest VmRSS sampled every 20 ms", func(st *burstStats) string { return fmtKiB(median(st.rssSampled)) })
	row("boxrt RSS right after the burst", func(st *burstStats) string { return fmtKiB(median(st.rssAfter)) })
	row("boxrt RSS after the idle wait", func(st *burstStats) string { return fmtKiB(median(st.rssIdle)) })
	row("boxrt CPU time over the idle wait / context switches", func(st *burstStats) string {
		if len(st.idleCPU) == 0 {
			return "—"
		}
		return fmt.Sprintf("%.0f ms / %.0f", median(st.idleCPU), median(st.idleSwitch))
	})
	return t.String()
}

// burstGoals words the burst goals: every call of both cases answered,
// the large case's RSS peak, the queue wait reported.
func burstGoals(cases []burstParams, stats []*burstStats) []Goal {
	var goals []Goal
	for i, c := range cases {
		g := Goal{Text: fmt.Sprintf("burst: %d box_exec sent at once over %d bwrap sessions all complete (none refused)", c.execs, c.sessions)}
		st := stats[i]
		if len(st.answered) > 0 {
			a := median(st.answered)
			g.Measured = fmt.Sprintf("%.0f / %d answered with their output; queue wait p99 %.0f ms", a, c.execs, median(st.queueP99))
			g.Met = boolp(a == float64(c.execs) && st.exec.Errors == 0)
		} else {
			g.Measured = "not measured"
		}
		goals = append(goals, g)
	}
	large, st := cases[len(cases)-1], stats[len(stats)-1]
	peak := Goal{Text: fmt.Sprintf("burst: boxrt RSS peak ≤ %s during the %d-call burst", fmtKiB(burstPeakKiB), large.execs), Measured: "not measured"}
	if len(st.rssPeak) > 0 {
		p := median(st.rssPeak)
		peak.Measured = fmt.Sprintf("VmHWM %s (before the burst %s)", fmtKiB(p), fmtKiB(median(st.rssBefore)))
		peak.Met = boolp(p <= burstPeakKiB)
	}
	return append(goals, peak)
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

// burstCase runs one case cfg.reps times.
func (b *bench) burstCase(ctx context.Context, cfg burstParams) *burstStats {
	st := &burstStats{exec: newMeasure(fmt.Sprintf("boxrt bwrap: box_exec, %d at once over %d sessions", cfg.execs, cfg.sessions))}
	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		b.burstRun(ctx, cfg, st, rep)
		b.logf("burst %d/%d rep %d: answered %.0f, queue wait p99 %.0f ms, RSS before %s, peak %s, after %s, after %s idle %s",
			cfg.execs, cfg.sessions, rep+1, last(st.answered), last(st.queueP99), fmtKiB(last(st.rssBefore)),
			fmtKiB(last(st.rssPeak)), fmtKiB(last(st.rssAfter)), cfg.idle, fmtKiB(last(st.rssIdle)))
	}
	return st
}

// burstRun is one run of a burst case.
func (b *bench) burstRun(ctx context.Context, cfg burstParams, st *burstStats, rep int) {
	// Every session's sandbox stays running (bwrap.idle_release_sec 0):
	// creating hundreds takes longer than the default release, and the
	// burst is about queueing execs on live sessions, not restarting
	// sandboxes.
	conf := fmt.Sprintf(`{"backend":"bwrap","limits":{"max_sessions":%d,"session_ttl_sec":3600},"bwrap":{"idle_release_sec":0}}`, max(64, cfg.sessions))
	p, err := b.startBoxrt(ctx, boxrtOpts{Name: "burst", Stdio: true, Config: conf})
	if err != nil {
		st.exec.Unavailable = err.Error()
		return
	}
	defer p.stop(60 * time.Second)
	if err := b.checkBackend(ctx, p, "bwrap"); err != nil {
		st.exec.Unavailable = err.Error()
		return
	}

	created := b.burstSessions(ctx, p, cfg.sessions, rep, st)
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
	logStart := fileSize(p.logPath)
	stopSampling, sampled := sampleRSS(pid)
	samples, wall := burstFire(ctx, p, created, cfg.execs, st)
	stopSampling()
	if len(samples) > 0 {
		st.exec.add(summarise(samples, wall))
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
	waits, err := queueWaits(p.logPath, logStart)
	if err != nil {
		st.notes = append(st.notes, fmt.Sprintf("run %d: no queue wait: %v", rep+1, err))
	}
	st.answered = append(st.answered, float64(len(samples)))
	st.queueP99 = append(st.queueP99, float64(percentile(waits, 99).Milliseconds()))
	st.rssBefore = append(st.rssBefore, float64(before))
	st.rssPeak = append(st.rssPeak, float64(peak))
	st.rssSampled = append(st.rssSampled, float64(sampled()))
	st.rssAfter = append(st.rssAfter, float64(after))
	st.rssIdle = append(st.rssIdle, float64(idle))
	if cpu1, sw1, err := procCPU(pid); err == nil && cpuErr == nil {
		st.idleCPU = append(st.idleCPU, float64((cpu1 - cpu0).Milliseconds()))
		st.idleSwitch = append(st.idleSwitch, float64(sw1-sw0))
	}
}

// burstSessions creates n sessions, returning those it made.
func (b *bench) burstSessions(ctx context.Context, p *boxrtProc, n, rep int, st *burstStats) []string {
	var created []string
	for i := range n {
		id := fmt.Sprintf("bench-burst-%d-%03d", rep, i)
		if _, err := p.rpc.Call(ctx, "box_create_session", map[string]any{"session_id": id}); err != nil {
			st.exec.fail(fmt.Errorf("create %s: %w", id, err))
			continue
		}
		created = append(created, id)
	}
	return created
}

// burstFire sends execs calls at once, round-robin over sessions, and
// returns the times of those answered with their output; any other
// answer (a refusal included) is a failure.
func burstFire(ctx context.Context, p *boxrtProc, sessions []string, execs int, st *burstStats) ([]time.Duration, time.Duration) {
	var mu sync.Mutex
	var samples []time.Duration
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range execs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := time.Now()
			r, err := boxExec(ctx, p.rpc, sessions[i%len(sessions)], burstCmd)
			d := time.Since(s)
			if err == nil && !strings.HasSuffix(r.Stdout, "\n2000\n") {
				err = errors.New("unexpected stdout: " + truncate(r.Stdout, 100))
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				st.exec.fail(err)
				return
			}
			samples = append(samples, d)
		}()
	}
	wg.Wait()
	return samples, time.Since(t0)
}

// sampleRSS samples pid's VmRSS every 20 ms until stop; max is the
// highest seen.
func sampleRSS(pid int) (stop func(), highest func() int64) {
	var sampled atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, err := rssKiB(pid); err == nil && v > sampled.Load() {
				sampled.Store(v)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); wg.Wait() }, sampled.Load
}

// queueWaits reads the box_exec calls' queue waits (queued_ms, absent
// for a call that ran at once) from boxrt's log after offset, sorted.
func queueWaits(logPath string, offset int64) ([]time.Duration, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, err
	}
	var waits []time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev struct {
			Message  string  `json:"message"`
			Method   string  `json:"method"`
			QueuedMS float64 `json:"queued_ms"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Message != "rpc" || ev.Method != "box_exec" {
			continue
		}
		waits = append(waits, time.Duration(ev.QueuedMS*float64(time.Millisecond)))
	}
	slices.Sort(waits)
	return waits, sc.Err()
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
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
