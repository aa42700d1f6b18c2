package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"
)

func (b *bench) scenarioSession(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "Session create-to-first-output"}
	sc.Intro = fmt.Sprintf(`Per run, %d (docker) / %d (bwrap) `+"`box_exec {\"session_id\":<new id>,\"cmd\":\"echo hi\"}`"+` calls on
session ids never used before: the time from the request to the answer carrying "hi" covers creating the sandbox
(docker: workspace volume, container create and start; bwrap: the session's state directory, stage and disk) and the first exec.
Each session is deleted right afterwards (`+"`box_delete_session`"+`, timed separately, below).
**Baseline:** `+"`docker run --rm %s echo hi`"+` through the CLI — a throwaway container per call, what a naive
runtime does — for both backends; for bwrap also the bare bwrap command boxrt runs for the exec (see the warm-exec scenario) on a freshly made
directory with workspace, tmp and home in it, `+"`/bin/sh -lc 'echo hi'`"+`, and the minimal bwrap spawn of the warm-exec
scenario running `+"`/bin/echo hi`"+`.`,
		cfg.coldNDocker, cfg.coldNBwrap, cfg.image)

	boxDocker := newMeasure("boxrt docker, new session")
	boxBwrap := newMeasure("boxrt bwrap, new session")
	run := newMeasure("`docker run --rm` CLI")
	direct := newMeasure("bare bwrap, new dir")
	minimal := newMeasure("minimal bwrap spawn of echo")
	delDocker := newMeasure("boxrt docker: box_delete_session")
	delBwrap := newMeasure("boxrt bwrap: box_delete_session")
	sc.Rows = []Row{
		{Case: "docker backend", Boxrt: boxDocker, Base: run},
		{Case: "bwrap backend", Boxrt: boxBwrap, Base: run},
		{Case: "bwrap backend vs bare bwrap", Boxrt: boxBwrap, Base: direct},
		{Case: "bwrap backend vs minimal bwrap spawn", Boxrt: boxBwrap, Base: minimal},
	}
	sc.Extra = []*Measure{delDocker, delBwrap}
	if !b.wantBackend("docker") {
		boxDocker.Unavailable, delDocker.Unavailable, run.Unavailable = skippedBackend, skippedBackend, skippedBackend
	} else if _, err := runCmd(ctx, "docker", "image", "inspect", cfg.image); err != nil {
		run.Unavailable = "docker image " + cfg.image + " missing (scripts/build-test-image): " + firstLine(err.Error())
	}
	if !b.wantBackend("bwrap") {
		boxBwrap.Unavailable, delBwrap.Unavailable, direct.Unavailable, minimal.Unavailable = skippedBackend, skippedBackend, skippedBackend, skippedBackend
	}

	// One boxrt per backend for the whole scenario: a host keeps its boxrt;
	// what is measured is the new session, not boxrt's start.
	start := func(name, backend string, m, del *Measure) *boxrtProc {
		if m.Unavailable != "" {
			return nil
		}
		p, err := b.startBackend(ctx, name, backend, false, nil)
		if err != nil {
			m.Unavailable, del.Unavailable = err.Error(), err.Error()
			return nil
		}
		return p
	}
	pDocker := start("cold-docker", "docker", boxDocker, delDocker)
	if pDocker != nil {
		defer pDocker.stop(30 * time.Second)
	}
	pBwrap := start("cold-bwrap", "bwrap", boxBwrap, delBwrap)
	if pBwrap != nil {
		defer pBwrap.stop(30 * time.Second)
	}

	// Each new session and its baseline are called in turn, so drift in
	// the machine's speed hits both alike.
	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		var dockerOps, bwrapOps []timedOp
		if pDocker != nil {
			dockerOps = append(dockerOps, coldSessionOp(ctx, pDocker, boxDocker, delDocker, fmt.Sprintf("bench-cold-docker-%d", rep)))
		}
		if run.Unavailable == "" {
			dockerOps = append(dockerOps, timedOp{m: run, op: func() error {
				out, err := runCmd(ctx, "docker", "run", "--rm", "--label", benchLabel+"="+b.token, cfg.image, "echo", "hi")
				if err != nil {
					return err
				}
				return expectOut(out, "hi\n")
			}})
		}
		if pBwrap != nil {
			bwrapOps = append(bwrapOps, coldSessionOp(ctx, pBwrap, boxBwrap, delBwrap, fmt.Sprintf("bench-cold-bwrap-%d", rep)))
		}
		if direct.Unavailable == "" {
			i := 0
			bwrapOps = append(bwrapOps, timedOp{m: direct, op: func() error {
				i++
				dir := filepath.Join(b.workDir, fmt.Sprintf("bwrap-cold-%d-%d", rep, i))
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				out, err := runBwrap(ctx, dir, "/bin/sh", "-lc", "echo hi")
				if err != nil {
					return err
				}
				return expectOut(out, "hi\n")
			}})
		}
		if minimal.Unavailable == "" {
			bwrapOps = append(bwrapOps, timedOp{m: minimal, op: func() error {
				out, err := runMinimalBwrap(ctx, "/bin/echo", "hi")
				if err != nil {
					return err
				}
				return expectOut(out, "hi\n")
			}})
		}
		timeInterleaved(ctx, cfg.coldNDocker, dockerOps...)
		timeInterleaved(ctx, cfg.coldNBwrap, bwrapOps...)
		b.logf("session rep %d: boxrt docker %s (delete %s), docker run %s, boxrt bwrap %s (delete %s), bwrap %s", rep+1,
			lastP50(boxDocker), lastP50(delDocker), lastP50(run), lastP50(boxBwrap), lastP50(delBwrap), lastP50(direct))
	}

	sc.Goals = append(sc.Goals,
		ratioGoal("boxrt bwrap new session → first output within 1.5× of a bare bwrap spawn on a fresh directory (p50)", boxBwrap, direct, 1.5),
		ratioGoal("boxrt bwrap new session → first output ≤ 1.2× a minimal bare bwrap spawn (p50)", boxBwrap, minimal, 1.2))

	t := "| teardown | p50 | p99 |\n|---|---:|---:|\n"
	for _, m := range []*Measure{delDocker, delBwrap} {
		t += fmt.Sprintf("| %s | %s | %s |\n", m.Label, cell(m, func(m *Measure) string { return fmtDur(m.P50()) }),
			cell(m, func(m *Measure) string { return fmtDur(m.P99()) }))
	}
	sc.Tables = append(sc.Tables, t)
	sc.Notes = append(sc.Notes, "`docker run --rm` carries the `"+benchLabel+"` label only so the final cleanup can find a stray one; ops/s for the new-session rows is 1 / mean create-to-output time (the deletes between them are not counted).")
	return sc
}

// newSessionOp is a box_exec "echo hi" on a new session id (prefix-i, i
// counting the op's calls), with extra params; then runs right after each,
// outside the op's time, with the session's id.
func newSessionOp(ctx context.Context, p *boxrtProc, m *Measure, prefix string, extra map[string]any, then func(sid string)) timedOp {
	var sid string
	i := 0
	return timedOp{m: m,
		op: func() error {
			sid = fmt.Sprintf("%s-%d", prefix, i)
			i++
			params := map[string]any{"session_id": sid, "cmd": "echo hi"}
			maps.Copy(params, extra)
			var r execResult
			if err := p.rpc.CallInto(ctx, "box_exec", params, &r); err != nil {
				return err
			}
			return expectOut(r.Stdout, "hi\n")
		},
		after: func() { then(sid) },
	}
}

// coldSessionOp is newSessionOp with each session deleted right after,
// the delete timed into del.
func coldSessionOp(ctx context.Context, p *boxrtProc, m, del *Measure, prefix string) timedOp {
	var dels []time.Duration
	o := newSessionOp(ctx, p, m, prefix, nil, func(sid string) {
		s := time.Now()
		if err := deleteSession(ctx, p.rpc, sid); err != nil {
			del.fail(err)
		} else {
			dels = append(dels, time.Since(s))
		}
	})
	o.done = func() { addSamples(del, dels) }
	return o
}
