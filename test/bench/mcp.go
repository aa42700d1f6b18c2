package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// scenarioMCP measures what a tool call adds over the JSON-RPC call it
// maps to: run_command("true") through `boxrt mcp` (the official Go SDK's
// client, stdio) against box_exec true through `boxrt serve --stdio`, on
// the same backend, interleaved.
func (b *bench) scenarioMCP(ctx context.Context) *Scenario {
	n := b.cfg.execNBwrap
	sc := &Scenario{Title: "MCP tool call vs box_exec"}
	sc.Intro = fmt.Sprintf(`The MCP server's added latency: per run, %d × the tool call `+"`run_command {\"command\":\"true\"}`"+`
to `+"`boxrt mcp`"+` (MCP over stdio, driven by the official Go MCP SDK's client) against %d × `+"`box_exec {\"cmd\":\"true\"}`"+`
to `+"`boxrt serve --stdio`"+` (JSON-RPC), interleaved, each on one warm session of the same backend. The tool call
includes the SDK's schema validation on both ends and the connection's session lookup.`, n, n)
	for _, backend := range []string{"bwrap", "docker"} {
		tool := newMeasure("MCP " + backend + ": run_command true")
		rpc := newMeasure("JSON-RPC " + backend + ": box_exec true")
		sc.Rows = append(sc.Rows, Row{Case: backend + ": warm `true`", Boxrt: tool, Base: rpc})
		if !b.wantBackend(backend) {
			unavailable([]*Measure{tool, rpc}, skippedBackend)
		} else {
			b.mcpRuns(ctx, backend, n, tool, rpc)
		}
		sc.Goals = append(sc.Goals, ratioGoal("MCP tool call run_command(\"true\") ≤ 1.2× JSON-RPC's box_exec, "+backend+" (p50)", tool, rpc, 1.2))
	}
	return sc
}

// mcpRuns measures one backend: a boxrt serving JSON-RPC and a boxrt mcp
// next to it, each with its own state directory.
func (b *bench) mcpRuns(ctx context.Context, backend string, n int, tool, rpc *Measure) {
	both := []*Measure{tool, rpc}
	cfg := b.backendConfig(backend, nil)
	p, err := b.startBoxrt(ctx, boxrtOpts{Name: "mcp-rpc-" + backend, Stdio: true, Config: cfg})
	if err == nil {
		err = b.checkBackend(ctx, p, backend)
	}
	if err != nil {
		unavailable(both, err.Error())
		return
	}
	defer p.stop(30 * time.Second)
	cs, err := b.startMCP(ctx, backend, cfg)
	if err != nil {
		unavailable(both, err.Error())
		return
	}
	defer cs.Close()
	sid := "bench-mcp-" + backend
	callTool := func() error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "true"}})
		if err == nil && res.IsError {
			err = fmt.Errorf("run_command true: %v", res.Content)
		}
		return err
	}
	for i := 0; i < 4; i++ { // creates the sessions, then warms them
		if err := callTool(); err != nil {
			tool.fail(err)
		}
		if _, err := boxExec(ctx, p.rpc, sid, "true"); err != nil {
			rpc.fail(err)
		}
	}
	for rep := 0; rep < b.cfg.reps && ctx.Err() == nil; rep++ {
		timeInterleaved(ctx, n, timedOp{m: tool, op: callTool}, timedOp{m: rpc, op: func() error {
			_, err := boxExec(ctx, p.rpc, sid, "true")
			return err
		}})
		b.logf("mcp %s rep %d: run_command %s vs box_exec %s", backend, rep+1, lastP50(tool), lastP50(rpc))
	}
	_ = deleteSession(ctx, p.rpc, sid)
}

// startMCP spawns `boxrt mcp` on its own state directory and connects the
// Go SDK's client to it; its log goes to the work directory.
func (b *bench) startMCP(ctx context.Context, backend, cfg string) (*mcp.ClientSession, error) {
	n := procSeq.Add(1)
	stateDir := filepath.Join(b.workDir, fmt.Sprintf("state-%03d-mcp-%s", n, backend))
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(b.workDir, fmt.Sprintf("boxrt-%03d-mcp-%s.log", n, backend)))
	if err != nil {
		return nil, err
	}
	cmd := command(false, b.boxrtBin, "mcp", "--state-dir", stateDir)
	cmd.Env = append(filteredEnv("BOXRT_CONFIG", "LANGBOT_BOX_CONFIG", "BOXRT_CONTROL_TOKEN", "LANGBOT_BOX_CONTROL_TOKEN"), "BOXRT_CONFIG="+cfg)
	cmd.Stderr = logFile
	client := mcp.NewClient(&mcp.Implementation{Name: "boxrt-bench", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		logFile.Close()
		return nil, fmt.Errorf("boxrt mcp: %v", err)
	}
	// The log file is the child's: closing it here leaves its copy open.
	logFile.Close()
	// The final cleanup removes this runtime's containers too.
	if id, err := os.ReadFile(filepath.Join(stateDir, "instance-id")); err == nil {
		b.instances[strings.TrimSpace(string(id))] = true
	}
	return cs, nil
}
