package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// scenarioMCP measures what a tool call adds over the JSON-RPC call it
// maps to: run_command("true") through `boxrt mcp` against box_exec true
// through `boxrt serve --stdio`, on the same backend, interleaved, both
// sent by the harness's own client so that the difference is boxrt's.
func (b *bench) scenarioMCP(ctx context.Context) *Scenario {
	n := b.cfg.execNBwrap
	sc := &Scenario{Title: "MCP tool call vs box_exec"}
	sc.Intro = fmt.Sprintf(`The MCP server's added latency: per run, %d × the tool call `+"`tools/call run_command {\"command\":\"true\"}`"+`
to `+"`boxrt mcp`"+` (MCP over stdio, after the initialize handshake) against %d × `+"`box_exec {\"cmd\":\"true\"}`"+`
to `+"`boxrt serve --stdio`"+` (JSON-RPC), interleaved, each on one warm session of the same backend. Both are sent by
the harness's JSON-RPC client, so the client's cost is on both sides; the tool call's includes the Go MCP SDK's
decoding and schema validation, the connection's session lookup and the result's two encodings (text and
structured).`, n, n)
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
	m, err := b.startBoxrt(ctx, boxrtOpts{Name: "mcp-" + backend, Stdio: true, MCP: true, Config: cfg})
	if err != nil {
		unavailable(both, err.Error())
		return
	}
	defer m.stop(30 * time.Second)
	sid := "bench-mcp-" + backend
	callTool := func() error { return runTool(ctx, m.rpc, "true") }
	for i := 0; i < 4; i++ { // creates the sessions, then warms them
		if err := callTool(); err != nil {
			tool.fail(err)
		}
		if _, err := boxExec(ctx, p.rpc, sid, "true"); err != nil {
			rpc.fail(err)
		}
	}
	if id, err := instanceOf(m); err == nil {
		b.instances[id] = true // the final cleanup looks for its containers too
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

// mcpInitialize is an MCP client's handshake: initialize, then the
// initialized notification.
func mcpInitialize(ctx context.Context, c *rpcClient) error {
	_, err := c.Call(ctx, "initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "boxrt-bench", "version": "1"}})
	if err != nil {
		return fmt.Errorf("MCP initialize: %w", err)
	}
	return c.t.Send(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
}

// runTool calls run_command and fails unless the command exited 0.
func runTool(ctx context.Context, c *rpcClient, command string) error {
	var res struct {
		IsError bool `json:"isError"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	err := c.CallInto(ctx, "tools/call", map[string]any{"name": "run_command", "arguments": map[string]any{"command": command}}, &res)
	if err == nil && res.IsError {
		err = fmt.Errorf("run_command %q: %v", command, res.Content)
	}
	return err
}

// instanceOf is the instance id of a runtime, from its state directory
// (boxrt mcp has no box_status to ask).
func instanceOf(p *boxrtProc) (string, error) {
	b, err := os.ReadFile(filepath.Join(p.stateDir, "instance-id"))
	return strings.TrimSpace(string(b)), err
}
