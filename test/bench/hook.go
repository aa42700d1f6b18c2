package main

import (
	"context"
	"fmt"
	"time"
)

// ─── HOOK: scenario 5, respawn-to-first-call and restart-to-first-call ───
//
// The reconnect measurements live in reconnect_*.go in this directory,
// written by the reconnect package's engineer. This file only calls them.
// A reconnect_*.go file plugs in by setting reconnectHook from an init
// function:
//
//	func init() { reconnectHook = benchReconnect }
//
//	func benchReconnect(ctx context.Context, env ReconnectEnv) ([]ReconnectCase, error) { … }
//
// The hook returns raw latency samples per repetition; the harness turns
// them into the same p50/p99/ops/s medians and boxrt-vs-baseline table as
// every other scenario. When no reconnect_*.go sets the hook, the report
// says scenario 5 was not measured and why.

// ReconnectEnv is what the harness hands the reconnect hook.
type ReconnectEnv struct {
	BoxrtBin string // the boxrt binary under test (absolute path)
	WorkDir  string // a scratch directory the hook may use (removed afterwards)
	Token    string // a control token to use with --listen, if needed
	Reps     int    // repetitions to make (≥3 in a full run)
	Cycles   int    // respawns / restarts per repetition
	Logf     func(format string, args ...any)
}

// ReconnectCase is one row: boxrt's reconnect client against a baseline
// that does the same without it.
type ReconnectCase struct {
	Case      string            // e.g. "respawn (child killed) → first call"
	Label     string            // what was measured, e.g. "reconnect.Client respawn"
	BaseLabel string            // the baseline, e.g. "fresh spawn + first __ping"; "" for none
	Runs      [][]time.Duration // per repetition, one sample per cycle
	BaseRuns  [][]time.Duration // per repetition, the baseline's samples
	Note      string            // one line for the report, optional
}

// reconnectHook is set by reconnect_*.go; nil when that file is missing.
var reconnectHook func(ctx context.Context, env ReconnectEnv) ([]ReconnectCase, error)

func (b *bench) scenarioReconnect(ctx context.Context) *Scenario {
	sc := &Scenario{Title: "Respawn-to-first-call and restart-to-first-call (reconnect client)"}
	if reconnectHook == nil {
		sc.Skipped = "**Not measured.** This scenario comes from the reconnect package's benchmark hook " +
			"(`test/bench/reconnect_*.go`, which sets `reconnectHook`; see `test/bench/hook.go`), and that file is not in this tree yet."
		return sc
	}
	env := ReconnectEnv{BoxrtBin: b.boxrtBin, WorkDir: b.workDir, Token: b.token, Reps: b.cfg.reconnectRep, Cycles: b.cfg.reconnectN, Logf: b.logf}
	cases, err := reconnectHook(ctx, env)
	if err != nil {
		sc.Notes = append(sc.Notes, "the reconnect hook failed: "+err.Error())
	}
	for _, c := range cases {
		m := newMeasure(c.Label)
		for _, run := range c.Runs {
			if len(run) > 0 {
				m.add(summariseSeq(run))
			}
		}
		var base *Measure
		if c.BaseLabel != "" {
			base = newMeasure(c.BaseLabel)
			for _, run := range c.BaseRuns {
				if len(run) > 0 {
					base.add(summariseSeq(run))
				}
			}
		}
		sc.Rows = append(sc.Rows, Row{Case: c.Case, Boxrt: m, Base: base})
		if c.Note != "" {
			sc.Notes = append(sc.Notes, c.Note)
		}
	}
	if len(cases) == 0 && err == nil {
		sc.Notes = append(sc.Notes, "the reconnect hook returned no cases")
	}
	sc.Intro = fmt.Sprintf("Measured by the reconnect package's hook (`test/bench/reconnect_*.go`), %d repetitions of %d cycles each; p50/p99 are medians over the repetitions of each one's p50/p99 (with few cycles per repetition, p99 is the slowest cycle).", b.cfg.reconnectRep, b.cfg.reconnectN)
	return sc
}

// summariseSeq summarises sequential samples: wall time is their sum.
func summariseSeq(samples []time.Duration) RunStats {
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	return summarise(samples, sum)
}
