package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// pingRun makes callers×perCaller __ping calls over one connection, each
// caller waiting for its answer before the next call, after a short warm-up.
func pingRun(ctx context.Context, c *rpcClient, callers, perCaller int) (RunStats, int, error) {
	warm := min(200, perCaller*callers)
	for i := 0; i < warm; i++ {
		if _, err := c.Call(ctx, "__ping", nil); err != nil {
			return RunStats{}, 0, err
		}
	}
	samples := make([][]time.Duration, callers)
	errs := make([]int, callers)
	var firstErr error
	var errMu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := 0; g < callers; g++ {
		samples[g] = make([]time.Duration, 0, perCaller)
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			<-start
			for i := 0; i < perCaller; i++ {
				t0 := time.Now()
				_, err := c.Call(ctx, "__ping", nil)
				d := time.Since(t0)
				if err != nil {
					errs[g]++
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
					if ctx.Err() != nil {
						return
					}
					continue
				}
				samples[g] = append(samples[g], d)
			}
		}(g)
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)
	var all []time.Duration
	nerr := 0
	for g := range samples {
		all = append(all, samples[g]...)
		nerr += errs[g]
	}
	return summarise(all, wall), nerr, firstErr
}

// measurePing makes one ping run and records it in m: over c (stdio), or
// over a fresh WebSocket to wsURL.
func measurePing(ctx context.Context, m *Measure, c *rpcClient, ws bool, wsURL, token string, callers, perCaller int) {
	if ws {
		var err error
		if c, err = dialRPC(ctx, wsURL, token, false); err != nil {
			m.fail(err)
			return
		}
		defer c.Close()
	}
	rs, nerr, err := pingRun(ctx, c, callers, perCaller)
	if rs.N > 0 {
		m.add(rs)
	}
	for k := 0; k < nerr; k++ {
		m.fail(err)
	}
	if rs.N == 0 && nerr == 0 && err != nil {
		m.fail(err)
	}
}

// pingProcessSets is how many fresh sets of processes (boxrt, echo peer,
// control) each repetition of a one-caller case spreads its calls over.
// Two identical processes differ by several per cent in one-caller
// latency (caches), and now and then one process answers at 2–4× its
// usual p50 for its whole life: its thread settled on the other CPU,
// whose vCPU must be woken for every call (where_time_goes.md); a row's
// p50 is the median of its runs, which a few such sets do not move.
const pingProcessSets = 8

func (b *bench) scenarioPing(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "`__ping` round trips (stdio and WebSocket)"}
	sc.Intro = fmt.Sprintf(`Each run spawns a fresh boxrt (`+"`serve --stdio`"+` for stdio; `+"`serve --listen 127.0.0.1:0`"+` with a control token for WebSocket)
and a fresh baseline peer, warms up with 200 calls, then makes %d sequential calls with 1 caller — boxrt and the peer run
side by side and take turns of %d calls in a row, so drift hits both, with a second echo peer taking turns too as a control
(its row shows how far two identical processes differ in the same run: a ratio inside that spread is noise); a one-caller
run spreads its calls over %d fresh sets of these processes, each a run of its own in the appendix, and a row's p50 is
the median of its runs — or %d callers × %d calls sharing one connection (as a host shares its one connection; boxrt's
run, then the peer's). Latency is from writing the request to reading its answer.
**Clients:** the one-caller rows use a direct client — the caller writes its request and reads its answer itself, so the
round trip is the peer's and the pipe's. The many-caller rows, and the stdio one-caller row marked *multiplexed*, use a
multiplexing client whose reader goroutine hands each answer to its caller, a second wake per call.
**Placement:** a one-caller round trip takes ~8 µs when the peer's thread runs on the caller's CPU and ~35–40 µs when it
runs on the other one (whose vCPU halts while idle and must be woken), and a process tends to keep one placement for its
life. The row *on one CPU* pins the caller's thread and every peer to CPU 0 (`+"`taskset -c 0`"+`): the per-call difference
with the placement held fixed.
**Baseline:** a minimal JSON-RPC echo peer — this harness's code run as a separate process behind the same pipes
(one JSON object per line, one write per answer) or a loopback WebSocket (coder/websocket, one message per text frame).
It decodes the id and answers `+"`{\"result\":{}}`"+`: no method table, no concurrency, no logging or metrics. The ratio is boxrt's protocol overhead.
Each echo role (baseline, control, CPU-matched) runs from its own copy of the harness's binary: a peer run from the
harness's own file shares its code pages with the client, which no server a host talks to does, and is faster for it
(see "Where the time goes").
**CPU-matched peer** (stdio, one caller): each set first calls boxrt and the echo peer %d times, in turns, and reads their
threads' CPU time (/proc/PID/task/*/schedstat); a third echo peer then busy-waits boxrt's extra CPU per call before each
answer and takes turns with the others. It shows how much of boxrt's one-caller ratio its CPU per call alone explains.
**Linked peer** (stdio, one caller): the echo peer's own loop in a binary that links the packages boxrt's main imports
(`+"`test/bench/linkedecho`"+`: boxrt's dependencies, their package initialisation, a binary of boxrt's size; none of boxrt's code
runs), taking turns with the others. It shows what being the boxrt binary costs one caller with the per-call code held equal,
and it is the one-caller goal's floor: no server built as the boxrt binary answers faster than the echo loop does in it,
so a boxrt p50 above the echo peer's but no slower than the linked peer's is reported as at its measured floor.`,
		cfg.pingN, pingBlock, pingProcessSets, cfg.pingCallers, cfg.pingConcN, cpuCalibrationCalls)

	type variant struct {
		name      string
		link      pingLink
		callers   int
		perCaller int
	}
	variants := []variant{
		{"stdio, 1 caller", pingLink{direct: true}, 1, cfg.pingN},
		{"stdio, 1 caller, on one CPU", pingLink{direct: true, oneCPU: true}, 1, cfg.pingN},
		{"stdio, 1 caller, multiplexed client", pingLink{}, 1, cfg.pingN},
		{fmt.Sprintf("stdio, %d callers", cfg.pingCallers), pingLink{}, cfg.pingCallers, cfg.pingConcN},
		{"WebSocket, 1 caller", pingLink{ws: true, direct: true}, 1, cfg.pingN},
		{fmt.Sprintf("WebSocket, %d callers", cfg.pingCallers), pingLink{ws: true}, cfg.pingCallers, cfg.pingConcN},
	}
	rows := make([]Row, len(variants))
	// controls[i], for a 1-caller variant: a second echo peer called in
	// turn with the other two, so the report shows how far two identical
	// processes differ in the same run — the size of the noise a ratio
	// must be read against.
	controls := make([]Row, len(variants))
	for i, v := range variants {
		tr := "stdio"
		if v.link.ws {
			tr = "ws"
		}
		if !v.link.direct && v.callers == 1 {
			tr += ", multiplexed"
		}
		if v.link.oneCPU {
			tr += ", one CPU"
		}
		rows[i] = Row{Case: v.name, Boxrt: newMeasure(fmt.Sprintf("boxrt %s ×%d", tr, v.callers)),
			Base: newMeasure(fmt.Sprintf("echo peer (%s)", tr))}
		if v.callers == 1 {
			controls[i] = Row{Case: v.name + ", control: a second echo peer", Boxrt: newMeasure(fmt.Sprintf("second echo peer (%s)", tr)), Base: rows[i].Base}
		}
	}

	floors := &stdioFloors{matched: newMeasure("echo peer with boxrt's extra CPU per call (stdio)")}
	if b.linkedEcho != "" {
		floors.linked = newMeasure("echo peer linked with boxrt's packages (stdio)")
	} else {
		b.logf("ping: no -linked-echo binary given (scripts/bench builds one); the linked echo row is not measured")
	}

	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		for i, v := range variants {
			if v.callers == 1 {
				var f *stdioFloors
				if i == 0 {
					f = floors
				}
				for set := range pingProcessSets {
					b.pingPair(ctx, rows[i], controls[i].Boxrt, f, v.link, max(v.perCaller/pingProcessSets, 1), set)
				}
			} else {
				b.pingBlocks(ctx, rows[i], v.link.ws, v.callers, v.perCaller)
			}
			b.logf("ping %s rep %d: boxrt p50 %s, echo p50 %s", v.name, rep+1, lastP50(rows[i].Boxrt), lastP50(rows[i].Base))
		}
	}
	medianExtra := medianDur(floors.extra)
	extra := "median " + fmtDur(medianExtra)
	if len(floors.extra) > 0 && medianExtra == 0 {
		extra = "median 0: boxrt used no more than the echo peer"
	}
	matchedRow := Row{Case: fmt.Sprintf("stdio, 1 caller, CPU-matched: an echo peer that spends boxrt's extra CPU per call (%s) before each answer",
		extra), Boxrt: floors.matched, Base: rows[0].Base}
	linkedRow := Row{Case: "stdio, 1 caller, linked: the echo peer's loop in a binary that links boxrt's packages (none of boxrt's code runs)",
		Boxrt: floors.linked, Base: rows[0].Base}
	for i := range variants {
		sc.Rows = append(sc.Rows, rows[i])
		if controls[i].Boxrt != nil {
			sc.Rows = append(sc.Rows, controls[i])
		}
		if i == 0 {
			sc.Rows = append(sc.Rows, matchedRow)
			if floors.linked != nil {
				sc.Rows = append(sc.Rows, linkedRow)
			}
		}
	}

	sc.Goals = append(sc.Goals, pingLatencyGoal(rows[0], controls[0], matchedRow, linkedRow, rows[2], rows[1]),
		pingThroughputGoal(rows[3], "stdio", 0.7), pingThroughputGoal(rows[5], "WebSocket", 0.8))
	return sc
}

// stdioFloors are the stdio one-caller case's two extra peers. Where idle
// vCPUs halt (this machine kind), one caller's p50 hinges on whether the
// answer comes before the waiting core goes idle, so small differences
// between servers move it by tens of per cent; these peers show which
// part of boxrt's ratio is its code and which is being the boxrt binary.
type stdioFloors struct {
	// matched: an echo peer that spends as much more CPU per call than
	// the plain echo peer as boxrt does, busy before each answer.
	matched *Measure
	// extra is boxrt's CPU per call above the echo peer's, one reading
	// per process set.
	extra []time.Duration
	// linked: the echo peer's loop in a binary that links boxrt's
	// packages (test/bench/linkedecho); nil without -linked-echo.
	linked *Measure
}

// cpuCalibrationCalls is how many calls, in turn to boxrt and the echo
// peer, a process set makes to read their CPU per call.
const cpuCalibrationCalls = 2000

// pingLink is how a ping run reaches its peers: over stdio or WebSocket,
// with a direct client (calls take turns, each reads its own answer) or a
// multiplexed one (a reader goroutine hands answers to the callers).
type pingLink struct {
	ws, direct bool
	// oneCPU: the caller's thread and every peer run on CPU 0 only.
	oneCPU bool
}

func (l pingLink) mode() string {
	if l.ws {
		return "ws"
	}
	return "stdio"
}

type pingSide struct {
	m   *Measure
	c   *rpcClient
	pid int
}

// pingPair is one run of one caller, the set-th of its repetition: a
// fresh boxrt and two fresh echo peers (the baseline and the control) —
// and, with floors, the linked and the CPU-matched echo peers — each
// warmed up, then taking turns.
func (b *bench) pingPair(ctx context.Context, row Row, control *Measure, floors *stdioFloors, link pingLink, n, set int) {
	type peer struct {
		m     *Measure
		start func() (pingSide, func(), error)
	}
	echo := func(m *Measure, work time.Duration, role string) peer {
		return peer{m, func() (pingSide, func(), error) {
			return pingPeerSide(ctx, m, link, func() (*echoPeer, error) { return b.startPingEcho(link, work, role) })
		}}
	}
	peers := []peer{{row.Boxrt, func() (pingSide, func(), error) { return b.pingBoxrtSide(ctx, row.Boxrt, link) }},
		echo(row.Base, 0, "baseline"), echo(control, 0, "control")}
	if floors != nil && floors.linked != nil {
		peers = append(peers, peer{floors.linked, func() (pingSide, func(), error) {
			return pingPeerSide(ctx, floors.linked, link, func() (*echoPeer, error) {
				return spawnEcho(command(link.oneCPU, b.linkedEcho), link)
			})
		}})
	}
	// The process started first lands on the far CPU more often than the
	// others (by hand, three peers, 6 runs each way: with boxrt started
	// last, the echo peer started first was far-placed in 4 runs and boxrt
	// in none; with boxrt first, boxrt in 2), so the start order rotates
	// from set to set.
	sides := make([]pingSide, len(peers))
	for k := range peers {
		j := (k + set) % len(peers)
		side, stop, err := peers[j].start()
		if err != nil {
			peers[j].m.fail(err)
			return
		}
		defer stop()
		sides[j] = side
	}
	if floors != nil {
		extra, err := extraCPUPerCall(ctx, sides[0], sides[1])
		if err != nil {
			floors.matched.fail(err)
			return
		}
		floors.extra = append(floors.extra, extra)
		side, stop, err := echo(floors.matched, extra, "matched").start()
		if err != nil {
			floors.matched.fail(err)
			return
		}
		defer stop()
		sides = append(sides, side)
	}
	var ops []timedOp
	for _, side := range sides {
		ops = append(ops, timedOp{m: side.m, op: func() error {
			_, err := side.c.Call(ctx, "__ping", nil)
			return err
		}})
	}
	if !link.oneCPU {
		timeInBlocks(ctx, n, pingBlock, ops...)
		return
	}
	if err := onCPU0(func() { timeInBlocks(ctx, n, pingBlock, ops...) }); err != nil {
		for _, side := range sides {
			side.m.fail(err)
		}
	}
}

// pingBlock is how many calls in a row each peer of a one-caller run gets
// before the next one's turn. Called one call each in turn, every call
// finds the peer's threads parked during the others' turns, and its p50 is
// decided by where the kernel wakes them: with a hand client, 4 peers in
// turn gave boxrt 19.0 µs against echo peers at 13.6 and 10.6 µs in one
// run and 11.6 against 11.3 and 11.7 in the next; in blocks of 100, all
// four read 7.7–7.9 µs in both (where_time_goes.md).
const pingBlock = 100

// warmPing makes 200 calls to side.
func warmPing(ctx context.Context, side pingSide) error {
	for i := 0; i < 200; i++ {
		if _, err := side.c.Call(ctx, "__ping", nil); err != nil {
			return err
		}
	}
	return nil
}

// extraCPUPerCall calls boxrt and the echo peer in turn, in blocks as the
// measured calls are, and returns how much more CPU time per call boxrt's
// threads used (0 if less).
func extraCPUPerCall(ctx context.Context, boxrt, echo pingSide) (time.Duration, error) {
	sides := []pingSide{boxrt, echo}
	var before, after [2]time.Duration
	for i, s := range sides {
		var err error
		if before[i], err = threadsCPU(s.pid); err != nil {
			return 0, err
		}
	}
	for range cpuCalibrationCalls / pingBlock {
		for _, s := range sides {
			for range pingBlock {
				if _, err := s.c.Call(ctx, "__ping", nil); err != nil {
					return 0, err
				}
			}
		}
	}
	for i, s := range sides {
		var err error
		if after[i], err = threadsCPU(s.pid); err != nil {
			return 0, err
		}
	}
	extra := (after[0] - before[0]) - (after[1] - before[1])
	return max(extra/cpuCalibrationCalls, 0), nil
}

// connect is the client for a peer: its stdio client, or a fresh
// WebSocket to url; done is a no-op for stdio (the peer's stop closes it).
func connect(ctx context.Context, stdio *rpcClient, link pingLink, url, token string) (c *rpcClient, done func(), err error) {
	if !link.ws {
		return stdio, func() {}, nil
	}
	if c, err = dialRPC(ctx, url, token, link.direct); err != nil {
		return nil, nil, err
	}
	return c, func() { c.Close() }, nil
}

// pingBlocks is one run of many callers: boxrt's, then the echo peer's.
func (b *bench) pingBlocks(ctx context.Context, row Row, ws bool, callers, perCaller int) {
	func() {
		p, err := b.startPingBoxrt(ctx, pingLink{ws: ws})
		if err != nil {
			row.Boxrt.fail(err)
			return
		}
		defer p.stop(10 * time.Second)
		measurePing(ctx, row.Boxrt, p.rpc, ws, p.wsURL(), b.token, callers, perCaller)
	}()
	e, err := b.startPingEcho(pingLink{ws: ws}, 0, "baseline")
	if err != nil {
		row.Base.fail(err)
		return
	}
	defer e.stop()
	measurePing(ctx, row.Base, e.rpc, ws, e.wsURL(), "", callers, perCaller)
}

// pingBoxrtSide starts boxrt for a one-caller run, connects to it and
// warms it up; stop ends both.
func (b *bench) pingBoxrtSide(ctx context.Context, m *Measure, link pingLink) (side pingSide, stop func(), err error) {
	p, err := b.startPingBoxrt(ctx, link)
	if err != nil {
		return side, nil, err
	}
	return warmSide(ctx, m, link, p.rpc, p.wsURL(), b.token, p.cmd.Process.Pid, func() { p.stop(10 * time.Second) })
}

// startPingBoxrt starts boxrt serving over stdio, or over WebSocket with
// the control token.
func (b *bench) startPingBoxrt(ctx context.Context, link pingLink) (*boxrtProc, error) {
	o := boxrtOpts{Name: "ping", Stdio: !link.ws, Listen: link.ws, DirectClient: link.direct, OneCPU: link.oneCPU}
	if link.ws {
		o.Token = b.token
	}
	return b.startBoxrt(ctx, o)
}

// startPingEcho starts the echo peer of role over stdio or WebSocket;
// work is its CPU time per answer (stdio only, see echopeer.ServeLines).
func (b *bench) startPingEcho(link pingLink, work time.Duration, role string) (*echoPeer, error) {
	if link.ws {
		work = 0
	}
	return b.startEcho(link, work, role)
}

// pingPeerSide starts a peer for a one-caller run, connects to it and
// warms it up; stop ends both.
func pingPeerSide(ctx context.Context, m *Measure, link pingLink, start func() (*echoPeer, error)) (side pingSide, stop func(), err error) {
	e, err := start()
	if err != nil {
		return side, nil, err
	}
	return warmSide(ctx, m, link, e.rpc, e.wsURL(), "", e.cmd.Process.Pid, e.stop)
}

// warmSide connects to a started peer (process pid, its stdio client or
// its WebSocket url) and warms it up; stop ends the connection, then the
// peer with stopPeer, which also runs if connecting or warming fails.
func warmSide(ctx context.Context, m *Measure, link pingLink, stdio *rpcClient, url, token string, pid int, stopPeer func()) (side pingSide, stop func(), err error) {
	c, closeConn, err := connect(ctx, stdio, link, url, token)
	if err != nil {
		stopPeer()
		return side, nil, err
	}
	stop = func() { closeConn(); stopPeer() }
	side = pingSide{m: m, c: c, pid: pid}
	if err := warmPing(ctx, side); err != nil {
		stop()
		return side, nil, err
	}
	return side, stop, nil
}

func dialRPC(ctx context.Context, url, token string, direct bool) (*rpcClient, error) {
	t, err := dialWS(ctx, url, token)
	if err != nil {
		return nil, err
	}
	return newClient(t, direct), nil
}

// pingLatencyGoal: one caller over stdio, p50 no slower than the echo peer
// and at most 40 µs, client round trip included. The control row's ratio
// (two identical echo peers) says how much of a ratio is noise; the
// CPU-matched row how much boxrt's CPU per call costs an echo; the linked
// row what the boxrt binary costs with the echo's own code; the
// multiplexed row what the same case gives through a client's handoff.
func pingLatencyGoal(r, control, matched, linked, multiplexed, oneCPU Row) Goal {
	g := Goal{Text: "`__ping` over stdio, 1 caller: p50 at most the echo peer's (≤ 1.0×) and ≤ 40 µs (client round trip included)"}
	if !r.Boxrt.ok() || !r.Base.ok() {
		g.Measured = "not measured"
		return g
	}
	b, e := r.Boxrt.P50(), r.Base.P50()
	g.Measured = fmt.Sprintf("p50 %s vs echo peer %s = %s", fmtDur(b), fmtDur(e), fmtRatio(float64(b), float64(e)))
	if control.Boxrt.ok() {
		g.Measured += fmt.Sprintf(" (control: a second echo peer, taking turns with both, %s = %s the first)",
			fmtDur(control.Boxrt.P50()), fmtRatio(float64(control.Boxrt.P50()), float64(e)))
	}
	if matched.Boxrt.ok() {
		g.Measured += fmt.Sprintf("; an echo peer that spends boxrt's extra CPU per call before answering: %s = %s",
			fmtDur(matched.Boxrt.P50()), fmtRatio(float64(matched.Boxrt.P50()), float64(e)))
	}
	if linked.Boxrt.ok() {
		g.Measured += fmt.Sprintf("; the echo peer's own loop in a binary that links boxrt's packages: %s = %s",
			fmtDur(linked.Boxrt.P50()), fmtRatio(float64(linked.Boxrt.P50()), float64(e)))
	}
	if oneCPU.Boxrt.ok() && oneCPU.Base.ok() {
		g.Measured += fmt.Sprintf("; with the caller and both peers on one CPU (no wake crosses CPUs): %s vs %s = %s", fmtDur(oneCPU.Boxrt.P50()),
			fmtDur(oneCPU.Base.P50()), fmtRatio(float64(oneCPU.Boxrt.P50()), float64(oneCPU.Base.P50())))
	}
	if multiplexed.Boxrt.ok() && multiplexed.Base.ok() {
		g.Measured += fmt.Sprintf("; with the multiplexed client: %s vs %s = %s", fmtDur(multiplexed.Boxrt.P50()),
			fmtDur(multiplexed.Base.P50()), fmtRatio(float64(multiplexed.Boxrt.P50()), float64(multiplexed.Base.P50())))
	}
	if e > 40*time.Microsecond {
		g.Measured += fmt.Sprintf("; the absolute 40 µs is below this machine's floor: the echo peer alone, which does nothing but answer, takes %s", fmtDur(e))
	}
	g.Met = boolp(b <= e && b <= 40*time.Microsecond)
	// The linked peer runs the echo peer's own loop in a binary that links
	// the packages boxrt must (its backends' clients, metrics, CLI): no
	// server built as the boxrt binary answers faster than it does.
	if !*g.Met && b <= 40*time.Microsecond && linked.Boxrt.ok() && b <= linked.Boxrt.P50() {
		g.AtFloor = true
		g.Measured += fmt.Sprintf("; the floor is the linked peer: boxrt's p50 is no slower than the echo peer's own loop in the boxrt binary's packages (%s vs %s)",
			fmtDur(b), fmtDur(linked.Boxrt.P50()))
	}
	return g
}

// pingThroughputGoal: many callers sharing one connection, ops/s at least
// min × the echo peer's over the same transport.
func pingThroughputGoal(r Row, transport string, min float64) Goal {
	g := Goal{Text: fmt.Sprintf("`__ping` over %s, %s: ops/s at least %.1f× the echo peer's", transport, strings.TrimPrefix(r.Case, transport+", "), min)}
	if !r.Boxrt.ok() || !r.Base.ok() {
		g.Measured = "not measured"
		return g
	}
	b, e := r.Boxrt.OpsPerSec(), r.Base.OpsPerSec()
	g.Measured = fmt.Sprintf("%s vs %s ops/s = %s", fmtOps(b), fmtOps(e), fmtRatio(b, e))
	g.Met = boolp(b >= min*e)
	return g
}

func lastP50(m *Measure) string {
	if len(m.Runs) == 0 {
		return "n/a"
	}
	return fmtDur(m.Runs[len(m.Runs)-1].P50)
}
