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
	sc := &Scenario{Title: "`__ping` round trips (stdio and WebSocket)", Breakdown: "where_time_goes.md"}
	sc.Intro = fmt.Sprintf(`A regression guard, not a goal to tune: no host notices a ping next to a millisecond exec. Each run spawns
a fresh boxrt (`+"`serve --stdio`"+`, or `+"`serve --listen 127.0.0.1:0`"+` with a control token for WebSocket) and a fresh
baseline peer, warms both up with 200 calls, then makes %d calls with 1 caller, boxrt and the peer taking turns of %d calls
(spread over %d fresh pairs of processes; a row's p50 is the median of its runs), or %d callers × %d calls sharing one
connection. The one-caller rows use a client that reads its own answers; the others, and the row marked *multiplexed*, a
client whose reader goroutine hands each answer to its caller. *On one CPU* pins the caller and both peers to CPU 0.
**Baseline:** a minimal JSON-RPC echo peer (test/bench/echopeer) behind the same pipes or a loopback WebSocket: it decodes
the id and answers `+"`{\"result\":{}}`"+`, nothing else, so the ratio is boxrt's protocol overhead.`,
		cfg.pingN, pingBlock, pingProcessSets, cfg.pingCallers, cfg.pingConcN)

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
	}

	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		for i, v := range variants {
			if v.callers == 1 {
				for set := range pingProcessSets {
					b.pingPair(ctx, rows[i], v.link, max(v.perCaller/pingProcessSets, 1), set)
				}
			} else {
				b.pingBlocks(ctx, rows[i], v.link.ws, v.callers, v.perCaller)
			}
			b.logf("ping %s rep %d: boxrt p50 %s, echo p50 %s", v.name, rep+1, lastP50(rows[i].Boxrt), lastP50(rows[i].Base))
		}
	}
	sc.Rows = rows
	sc.Goals = append(sc.Goals, pingLatencyGoal(rows[0]),
		pingThroughputGoal(rows[3], "stdio", 0.7), pingThroughputGoal(rows[5], "WebSocket", 0.8))
	return sc
}

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
// fresh boxrt and a fresh echo peer, each warmed up, then taking turns.
func (b *bench) pingPair(ctx context.Context, row Row, link pingLink, n, set int) {
	starts := []func() (pingSide, func(), error){
		func() (pingSide, func(), error) { return b.pingBoxrtSide(ctx, row.Boxrt, link) },
		func() (pingSide, func(), error) {
			return pingPeerSide(ctx, row.Base, link, func() (*echoPeer, error) { return b.startEcho(link) })
		},
	}
	ms := []*Measure{row.Boxrt, row.Base}
	// The process started first lands on the far CPU more often (by
	// hand: where_time_goes.md), so the start order alternates.
	sides := make([]pingSide, len(starts))
	for k := range starts {
		j := (k + set) % len(starts)
		side, stop, err := starts[j]()
		if err != nil {
			ms[j].fail(err)
			return
		}
		defer stop()
		sides[j] = side
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
	e, err := b.startEcho(pingLink{ws: ws})
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

// pingLatencyGoal: one caller over stdio, p50 no worse than 1.2× the
// echo peer's: a regression guard.
func pingLatencyGoal(r Row) Goal {
	return ratioGoal("`__ping` over stdio, 1 caller: p50 ≤ 1.2× the echo peer's (a regression guard)", r.Boxrt, r.Base, 1.2)
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
