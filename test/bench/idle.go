package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// idleReleaseSec is the bwrap.idle_release_sec of the idle scenario:
// short, so its sessions are released within the run.
const idleReleaseSec = 2

// idleGoalKiB is the goal for boxrt's RSS per idle session.
const idleGoalKiB = 8

// idleSettle is how long the scenario waits once the sessions are made:
// past the idle release (its scan runs every quarter of it), and past two
// of boxrt's memory checks (10 s apart), which give a burst's heap back
// to the system.
const idleSettle = idleReleaseSec*time.Second*3/2 + 22*time.Second

// scenarioIdle measures what an idle session costs boxrt itself: a fresh
// boxrt with bwrap's idle release on creates N sessions and leaves them
// idle; boxrt's RSS and goroutines are read before and after.
func (b *bench) scenarioIdle(ctx context.Context) *Scenario {
	n := b.cfg.scaleBwrap
	sc := &Scenario{Title: fmt.Sprintf("Idle session memory: %d idle bwrap sessions", n)}
	sc.Intro = fmt.Sprintf(`A fresh boxrt (stdio and a token-protected listener for /metrics; bwrap, bwrap.idle_release_sec %d, limits.max_sessions
5000) creates, execs in and deletes one warm-up session, waits 1 s, reads its VmRSS (/proc/<pid>/status) and go_goroutines
(/metrics); then creates %d sessions from 4 concurrent callers, leaves them idle %s (their sandboxes are released: stopped,
files kept; boxrt gives the creation burst's heap back to the system) and reads both again. Per idle session = the
growth ÷ %d. Only boxrt's own memory: the sandboxes are separate processes, and once released there are none.
Right after the first reading and again after the second, it times %d new sessions' first output (`+"`box_exec echo hi`"+`
on a new id, deleted untimed): a new session with N idle sessions whose sandboxes were released, as they are by default
(bwrap.idle_release_sec 30), against none. The scale scenario times the same with every sandbox still running.`,
		idleReleaseSec, n, idleSettle, n, flatSamples)
	m := newMeasure(fmt.Sprintf("boxrt bwrap: %d idle sessions", n))
	fresh := idleNewSessions{
		none: newMeasure("boxrt bwrap: new session → first output, no other session"),
		idle: newMeasure(fmt.Sprintf("boxrt bwrap: new session → first output with %d idle sessions, sandboxes released", n)),
	}
	sc.Extra = []*Measure{m}
	sc.Rows = []Row{{Case: fmt.Sprintf("bwrap: new session → first output with %d idle sessions (sandboxes released) vs none", n),
		Boxrt: fresh.idle, Base: fresh.none}}
	rssPer, gPer, notes := b.idleRun(ctx, n, m, fresh)
	sc.Notes = append(sc.Notes, notes...)
	goal := Goal{Text: fmt.Sprintf("idle session memory: boxrt RSS per idle bwrap session at %d sessions (idle release on) ≤ %d KiB, and no goroutine per idle session", n, idleGoalKiB),
		Measured: "not measured"}
	if m.Unavailable == "" && !math.IsNaN(rssPer) {
		goal.Measured = fmt.Sprintf("%.1f KiB and %.3f goroutines per idle session", rssPer, gPer)
		goal.Met = boolp(rssPer <= idleGoalKiB && gPer < 0.01)
		sc.Tables = append(sc.Tables, fmt.Sprintf("| metric | boxrt bwrap |\n|---|---:|\n| **boxrt RSS per idle session** | **%.1f KiB** |\n| goroutines per idle session | %.3f |\n", rssPer, gPer))
	}
	sc.Goals = []Goal{goal}
	return sc
}

// idleNewSessions are the new-session times of the idle scenario: with no
// other session, and with its idle sessions released.
type idleNewSessions struct{ none, idle *Measure }

// idleRun is the scenario's one run: RSS growth (KiB) and goroutines per
// idle session, NaN when not measured.
func (b *bench) idleRun(ctx context.Context, n int, m *Measure, fresh idleNewSessions) (rssPer, gPer float64, notes []string) {
	nan := func(err error) (float64, float64, []string) {
		m.fail(err)
		return math.NaN(), math.NaN(), notes
	}
	cfg := fmt.Sprintf(`{"backend":"bwrap","limits":{"max_sessions":5000,"session_ttl_sec":3600},"bwrap":{"idle_release_sec":%d}}`, idleReleaseSec)
	p, err := b.startBoxrt(ctx, boxrtOpts{Name: "idle-bwrap", Stdio: true, Listen: true, Token: b.token, Config: cfg})
	if err != nil {
		m.Unavailable = err.Error()
		return math.NaN(), math.NaN(), nil
	}
	defer p.stop(60 * time.Second)
	if err := b.checkBackend(ctx, p, "bwrap"); err != nil {
		m.Unavailable = err.Error()
		return math.NaN(), math.NaN(), nil
	}
	if _, err := boxExec(ctx, p.rpc, "bench-idle-warm", "true"); err != nil {
		return nan(fmt.Errorf("warm-up: %w", err))
	}
	_ = deleteSession(ctx, p.rpc, "bench-idle-warm")
	time.Sleep(time.Second)
	rss0, err1 := rssKiB(p.pid())
	g0, err2 := goroutines(ctx, p.addr, b.token)
	if err1 != nil || err2 != nil {
		return nan(fmt.Errorf("before: %v %v", err1, err2))
	}
	timeNewSessions(ctx, p, fresh.none, "bench-idle-new0-", nil, nil)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-idle-%04d", i)
	}
	made := &scaleStats{create: newMeasure("create")}
	_, created, _ := b.createSessions(ctx, p, made, ids)
	if made.create.Errors > 0 {
		notes = append(notes, fmt.Sprintf("%d of %d sessions could not be created (measured over the others); first error: %s",
			made.create.Errors, n, made.create.FirstErr))
	}
	defer func() {
		for _, id := range created {
			_ = deleteSession(context.Background(), p.rpc, id)
		}
	}()
	if len(created) == 0 {
		return nan(fmt.Errorf("no session created"))
	}
	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		return nan(ctx.Err())
	}
	rss1, err1 := rssKiB(p.pid())
	g1, err2 := goroutines(ctx, p.addr, b.token)
	if err1 != nil || err2 != nil {
		return nan(fmt.Errorf("after: %v %v", err1, err2))
	}
	timeNewSessions(ctx, p, fresh.idle, "bench-idle-newN-", nil, nil)
	notes = append(notes, fmt.Sprintf("%d sessions idle: boxrt VmRSS %s → %s, goroutines %d → %d",
		len(created), fmtKiB(float64(rss0)), fmtKiB(float64(rss1)), g0, g1))
	k := float64(len(created))
	return float64(rss1-rss0) / k, float64(g1-g0) / k, notes
}

// goroutines reads go_goroutines from boxrt's /metrics.
func goroutines(ctx context.Context, addr, token string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("no go_goroutines in /metrics (%s)", resp.Status)
}
