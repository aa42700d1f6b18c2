package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/boxrt/boxrt/reconnect"
)

// The dial-out scenario: one boxrt that both listens (/rpc/ws) and dials a
// host (serve --connect) built on reconnect.Listener, in this process on
// loopback. The same calls go through a reconnect.Client of each kind,
// alternating, so both paths share the runtime, the backend, the client
// library and the machine's noise: the difference is the dial-out
// connection (its replay buffer, the logical connection's reads and
// writes) against a plain WebSocket.

func (b *bench) scenarioDialOut(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "Dial-out runtime: a call over serve --connect vs a direct /rpc/ws WebSocket"}
	sc.Intro = fmt.Sprintf(`One boxrt serving both `+"`--listen 127.0.0.1:0`"+` and `+"`--connect ws://127.0.0.1:PORT/connect`"+`
to a host in the harness built on `+"`reconnect.Listener`"+`. Per run: %d sequential `+"`__ping`"+` calls and %d
`+"`box_exec {\"cmd\":\"true\"}`"+` on one warm bwrap session through each path, one call of each path in turn
(reconnect.Client on both: Listener.Accept's for dial-out, reconnect.Dial's for the WebSocket).`, cfg.pingN, cfg.execNBwrap)
	ping := newMeasure("dial-out: __ping")
	pingWS := newMeasure("direct /rpc/ws: __ping")
	exec := newMeasure("dial-out: box_exec true (bwrap)")
	execWS := newMeasure("direct /rpc/ws: box_exec true (bwrap)")
	sc.Rows = []Row{{Case: "dial-out call: __ping", Boxrt: ping, Base: pingWS}, {Case: "dial-out call: box_exec true, bwrap", Boxrt: exec, Base: execWS}}
	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		if err := b.dialOutRun(ctx, ping, pingWS, exec, execWS); err != nil {
			for _, m := range []*Measure{ping, pingWS, exec, execWS} {
				if len(m.Runs) == 0 {
					m.Unavailable = err.Error()
				}
			}
			sc.Notes = append(sc.Notes, fmt.Sprintf("run %d failed: %v", rep+1, err))
		}
	}
	sc.Goals = []Goal{
		ratioGoal("dial-out call (__ping) ≤ 1.1× the same call over a direct /rpc/ws WebSocket (p50)", ping, pingWS, 1.1),
		ratioGoal("dial-out call (box_exec true, bwrap) ≤ 1.1× over a direct /rpc/ws WebSocket (p50)", exec, execWS, 1.1),
	}
	return sc
}

// dialOutRun is one run: a fresh boxrt and host, both clients, the calls.
func (b *bench) dialOutRun(ctx context.Context, ping, pingWS, exec, execWS *Measure) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	host, err := reconnect.NewListener([]string{b.token})
	if err != nil {
		ln.Close()
		return err
	}
	defer host.Close()
	mux := http.NewServeMux()
	mux.Handle("GET /connect", host)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	p, err := b.startBoxrt(ctx, boxrtOpts{Name: "dialout", Listen: true, Config: `{"backend":"bwrap"}`, Token: b.token,
		Args: []string{"--connect", "ws://" + ln.Addr().String() + "/connect"}})
	if err != nil {
		return err
	}
	defer p.stop(5 * time.Second)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dialed, err := host.Accept(actx)
	if err != nil {
		return fmt.Errorf("the runtime did not dial in: %w (log %s)", err, p.logPath)
	}
	defer dialed.Close()
	direct, err := reconnect.Dial(actx, "http://"+p.addr, reconnect.WithToken(b.token))
	if err != nil {
		return err
	}
	defer direct.Close()

	call := func(c *reconnect.Client, method string, params any) func() error {
		return func() error { return c.Call(ctx, method, params, nil) }
	}
	if err := timedPairs(b.cfg.pingN, ping, pingWS, call(dialed, "__ping", struct{}{}), call(direct, "__ping", struct{}{})); err != nil {
		return err
	}
	execParams := map[string]any{"session_id": "dialout-bench", "cmd": "true"}
	if err := dialed.Call(ctx, "box_exec", execParams, nil); err != nil { // creates and warms the session
		return fmt.Errorf("box_exec on bwrap: %w", err)
	}
	defer dialed.Call(ctx, "box_delete_session", map[string]any{"session_id": "dialout-bench"}, nil)
	return timedPairs(b.cfg.execNBwrap, exec, execWS, call(dialed, "box_exec", execParams), call(direct, "box_exec", execParams))
}

// timedPairs makes n calls of a and of b, alternating which goes first,
// after a warm-up of each, and records their latencies.
func timedPairs(n int, ma, mb *Measure, a, b func() error) error {
	for range min(n/10+1, 100) {
		if err := a(); err != nil {
			return err
		}
		if err := b(); err != nil {
			return err
		}
	}
	sa, sb := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	timed := func(f func() error, into *[]time.Duration) error {
		t0 := time.Now()
		err := f()
		*into = append(*into, time.Since(t0))
		return err
	}
	for i := range n {
		first, second := func() error { return timed(a, &sa) }, func() error { return timed(b, &sb) }
		if i%2 == 1 {
			first, second = second, first
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
	}
	ma.add(summariseSeq(sa))
	mb.add(summariseSeq(sb))
	return nil
}
