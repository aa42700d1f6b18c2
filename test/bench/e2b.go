package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// e2bSDKDir holds the pinned E2B SDK and the timed loops (bench.mjs) the
// scenario runs; the bench runs from the repository root.
const e2bSDKDir = "test/e2b"

// e2bImage is the docker image of both paths on docker: the SDK's commands
// are `/bin/bash -l -c`, which the busybox test image lacks.
const e2bImage = "boxrt-sandbox:latest"

func (b *bench) scenarioE2B(ctx context.Context) *Scenario {
	cfg := b.cfg
	n := max(cfg.coldNBwrap, 3)
	sc := &Scenario{Title: "E2B SDK vs boxrt's JSON-RPC"}
	sc.Intro = fmt.Sprintf(`The official E2B JS SDK (test/e2b, pinned) against boxrt's E2B API (`+"`/e2b`, `/e2b/envd`"+`), side by side
with boxrt's own JSON-RPC on the same boxrt and backend. Per run: %d × `+"`Sandbox.create('base')`"+` → the first
stdout chunk of `+"`commands.run('echo hi')`"+` (each sandbox killed afterwards, untimed), against %d new-session
`+"`box_exec {\"cmd\":\"echo hi\"}`"+` calls (each session deleted afterwards, untimed); then %d × `+"`commands.run('true')`"+`
on one warm sandbox against %d warm `+"`box_exec {\"cmd\":\"true\"}`"+` on one session. The SDK's times are taken inside node
(performance.now), so node's start is not counted. Docker runs %s on both paths.`, n, n, 4*n, 4*n, e2bImage)
	node, sdkErr := e2bSDK(ctx)
	for _, backend := range []string{"bwrap", "docker"} {
		createSDK := newMeasure("E2B SDK " + backend + ": create → first output")
		createRPC := newMeasure("JSON-RPC " + backend + ": new session → first output")
		runSDK := newMeasure("E2B SDK " + backend + ": commands.run('true')")
		runRPC := newMeasure("JSON-RPC " + backend + ": box_exec true")
		sc.Rows = append(sc.Rows,
			Row{Case: backend + ": create → first output", Boxrt: createSDK, Base: createRPC},
			Row{Case: backend + ": warm run of `true`", Boxrt: runSDK, Base: runRPC})
		all := []*Measure{createSDK, createRPC, runSDK, runRPC}
		switch {
		case !b.wantBackend(backend):
			unavailable(all, skippedBackend)
		case sdkErr != nil:
			unavailable(all, sdkErr.Error())
		default:
			b.e2bRuns(ctx, backend, node, n, createSDK, createRPC, runSDK, runRPC)
		}
		sc.Goals = append(sc.Goals,
			ratioGoal("E2B SDK create → first output ≤ 1.2× JSON-RPC's, "+backend+" (p50)", createSDK, createRPC, 1.2),
			ratioGoal("E2B SDK commands.run ≤ 1.5× JSON-RPC's box_exec, "+backend+" (p50)", runSDK, runRPC, 1.5))
	}
	return sc
}

func unavailable(ms []*Measure, why string) {
	for _, m := range ms {
		m.Unavailable = why
	}
}

// e2bRuns measures one backend: one boxrt serving both paths, each run
// alternating the SDK's loop and its JSON-RPC counterpart.
func (b *bench) e2bRuns(ctx context.Context, backend, node string, n int, createSDK, createRPC, runSDK, runRPC *Measure) {
	conf := map[string]any{"backend": backend}
	if backend == "docker" {
		if _, err := runCmd(ctx, "docker", "image", "inspect", e2bImage); err != nil {
			unavailable([]*Measure{createSDK, createRPC, runSDK, runRPC}, "docker image "+e2bImage+" missing (scripts/build-image): "+firstLine(err.Error()))
			return
		}
		conf["docker"] = map[string]any{"image": e2bImage}
	}
	raw, _ := json.Marshal(conf)
	p, err := b.startBoxrt(ctx, boxrtOpts{Name: "e2b-" + backend, Stdio: true, Listen: true, Config: string(raw), Token: b.token})
	if err == nil {
		err = b.checkBackend(ctx, p, backend)
	}
	if err != nil {
		unavailable([]*Measure{createSDK, createRPC, runSDK, runRPC}, err.Error())
		return
	}
	defer p.stop(30 * time.Second)
	env := append(os.Environ(), "E2B_API_URL=http://"+p.addr+"/e2b", "E2B_SANDBOX_URL=http://"+p.addr+"/e2b/envd", "E2B_API_KEY="+b.token)
	sid := fmt.Sprintf("bench-e2b-warm-%s", backend)
	for i := 0; i < 4; i++ { // creates the session, then warms it
		if _, err := boxExec(ctx, p.rpc, sid, "true"); err != nil {
			runRPC.fail(err)
		}
	}
	for rep := 0; rep < b.cfg.reps && ctx.Err() == nil; rep++ {
		sdkLoop(ctx, node, env, "create", n, createSDK)
		timeInterleaved(ctx, n, coldSessionOp(ctx, p, createRPC, newMeasure("delete"), fmt.Sprintf("bench-e2b-%s-%d", backend, rep)))
		sdkLoop(ctx, node, env, "run", 4*n, runSDK)
		timeInterleaved(ctx, 4*n, timedOp{m: runRPC, op: func() error {
			_, err := boxExec(ctx, p.rpc, sid, "true")
			return err
		}})
		b.logf("e2b %s rep %d: SDK create %s vs JSON-RPC %s; SDK run %s vs JSON-RPC %s", backend, rep+1,
			lastP50(createSDK), lastP50(createRPC), lastP50(runSDK), lastP50(runRPC))
	}
	_ = deleteSession(ctx, p.rpc, sid)
}

// sdkLoop runs `node bench.mjs mode n` and adds its samples to m as one
// run.
func sdkLoop(ctx context.Context, node string, env []string, mode string, n int, m *Measure) {
	cctx, cancel := context.WithTimeout(ctx, time.Duration(n)*30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, node, "bench.mjs", mode, fmt.Sprint(n))
	cmd.Dir = e2bSDKDir
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		m.fail(fmt.Errorf("node bench.mjs %s: %v: %s", mode, err, truncate(stderr.String(), 400)))
		return
	}
	var ms []float64
	if err := json.Unmarshal(out, &ms); err != nil || len(ms) != n {
		m.fail(fmt.Errorf("node bench.mjs %s printed %q (%v), want %d samples", mode, truncate(string(out), 200), err, n))
		return
	}
	samples := make([]time.Duration, len(ms))
	for i, v := range ms {
		samples[i] = time.Duration(v * float64(time.Millisecond))
	}
	addSamples(m, samples)
}

// e2bSDK makes sure the pinned SDK is installed in e2bSDKDir (npm ci,
// as the tests do) and returns the node that runs it: $BOXRT_SDK_NODE
// (scripts/bench names one the SDK accepts) or node on PATH.
func e2bSDK(ctx context.Context) (string, error) {
	node := os.Getenv("BOXRT_SDK_NODE")
	if node == "" {
		node = "node"
	}
	if _, err := exec.LookPath(node); err != nil {
		return "", fmt.Errorf("node is needed for the E2B SDK (scripts/setup installs it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(e2bSDKDir, "node_modules", "e2b")); err == nil {
		return node, nil
	}
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = e2bSDKDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm ci in %s: %v: %s", e2bSDKDir, err, truncate(string(out), 400))
	}
	return node, nil
}
