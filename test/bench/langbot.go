package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// envelopeTransport speaks LangBot's action-RPC envelope to a `boxrt box
// -s` child while the bench's JSON-RPC client drives it: each request is
// rewritten to {"seq_id","action","data","context"} and each answer (its
// chunk lines reassembled) back to a JSON-RPC response, so the same client
// and the same pingRun measure both envelopes.
type envelopeTransport struct {
	lines *lineTransport
	ctx   json.RawMessage
}

func (e *envelopeTransport) Send(ctx context.Context, msg []byte) error {
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(msg, &req); err != nil {
		return err
	}
	if len(req.Params) == 0 {
		req.Params = json.RawMessage("{}")
	}
	out, err := json.Marshal(map[string]any{"seq_id": req.ID, "action": req.Method, "data": req.Params, "context": e.ctx})
	if err != nil {
		return err
	}
	return e.lines.Send(ctx, out)
}

func (e *envelopeTransport) Recv(ctx context.Context) ([]byte, error) {
	msg, err := e.lines.Recv(ctx)
	if err != nil {
		return nil, err
	}
	if bytes.HasPrefix(msg, []byte(`{"type":"chunk_start"`)) {
		var whole []byte
		for {
			line, err := e.lines.Recv(ctx)
			if err != nil {
				return nil, err
			}
			var c struct {
				Type string `json:"type"`
				Data string `json:"data"`
			}
			if err := json.Unmarshal(line, &c); err != nil {
				return nil, err
			}
			if c.Type == "chunk_end" {
				break
			}
			whole = append(whole, c.Data...)
		}
		msg = whole
	}
	var a struct {
		SeqID   json.RawMessage `json:"seq_id"`
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(msg, &a); err != nil {
		return nil, err
	}
	if a.Code != 0 {
		return json.Marshal(map[string]any{"id": a.SeqID, "error": map[string]any{"code": -32000, "message": a.Message}})
	}
	return json.Marshal(map[string]any{"id": a.SeqID, "result": a.Data})
}

func (e *envelopeTransport) Close() error { return e.lines.Close() }

// startLangBot spawns `boxrt box -s` as the LangBot host does and returns
// a JSON-RPC client over the envelope (every request carries a tenant
// context), and a stop function.
func (b *bench) startLangBot(ctx context.Context) (*rpcClient, func(), error) {
	n := procSeq.Add(1)
	stateDir := filepath.Join(b.workDir, fmt.Sprintf("state-%03d-langbot", n))
	logPath := filepath.Join(b.workDir, fmt.Sprintf("boxrt-%03d-langbot.log", n))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(b.boxrtBin, "box", "-s", "--host", "127.0.0.1", "--ws-control-port", "0", "--state-dir", stateDir)
	cmd.Env = append(filteredEnv("BOXRT_CONFIG", "LANGBOT_BOX_CONFIG", "BOXRT_CONTROL_TOKEN", "LANGBOT_BOX_CONTROL_TOKEN"),
		"LANGBOT_BOX_TRUSTED_INSTANCE_UUID=bench-instance", `LANGBOT_BOX_CONFIG={"backend":"nsjail"}`)
	cmd.Stderr = logFile
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logFile.Close()
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, nil, err
	}
	c := newRPCClient(&envelopeTransport{lines: newLineTransport(stdin, stdout),
		ctx: json.RawMessage(`{"instance_uuid":"bench-instance","workspace_uuid":"bench","placement_generation":1}`)})
	stop := func() {
		_ = c.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := c.Call(cctx, "__ping", nil); err != nil {
		stop()
		return nil, nil, fmt.Errorf("boxrt box does not answer __ping: %v; log %s:\n%s", err, logPath, tail(logPath, 20))
	}
	return c, stop, nil
}

// execRun makes n sequential box_exec calls printing size bytes each.
func execRun(ctx context.Context, c *rpcClient, n, size int) (RunStats, error) {
	params := map[string]any{"session_id": "bench", "cmd": fmt.Sprintf("head -c %d /dev/zero | tr '\\0' '<'", size)}
	if _, err := c.Call(ctx, "box_exec", params); err != nil { // warm: creates the session
		return RunStats{}, err
	}
	samples := make([]time.Duration, 0, n)
	t0 := time.Now()
	for range n {
		s := time.Now()
		res, err := c.Call(ctx, "box_exec", params)
		if err != nil {
			return RunStats{}, err
		}
		if !strings.Contains(string(res), `"exit_code":0`) {
			return RunStats{}, fmt.Errorf("box_exec failed: %.200s", res)
		}
		samples = append(samples, time.Since(s))
	}
	return summarise(samples, time.Since(t0)), nil
}

// scenarioLangBot compares the LangBot envelope (`boxrt box -s`, tenant
// context on every call, chunked answers) with JSON-RPC on the same binary.
func (b *bench) scenarioLangBot(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "LangBot envelope vs JSON-RPC (stdio, bwrap)"}
	sc.Intro = fmt.Sprintf(`Each run spawns `+"`boxrt box -s`"+` (LangBot's action-RPC envelope; every call carries a tenant context, so session ids
are namespaced and the generation fence runs) and, as the baseline, `+"`boxrt serve --stdio`"+` (JSON-RPC 2.0), both on bwrap.
Rows: %d sequential `+"`__ping`"+` calls; %d callers × %d calls on one connection; %d sequential `+"`box_exec`"+` calls printing
64 KiB of `+"`<`"+` (answers over 16 KiB go as chunk lines in the envelope). The envelope column includes this harness's
translation of each message to and from JSON-RPC (a decode and an encode of generic maps on each side, on the client's one
reading goroutine), which the JSON-RPC column does not pay: the ratio is an upper bound of the envelope's cost.`, cfg.pingN, cfg.pingCallers, cfg.pingConcN, cfg.execNCLI)
	type variant struct {
		name string
		run  func(context.Context, *rpcClient) (RunStats, error)
	}
	variants := []variant{
		{"`__ping`, 1 caller", func(ctx context.Context, c *rpcClient) (RunStats, error) {
			rs, _, err := pingRun(ctx, c, 1, cfg.pingN)
			return rs, err
		}},
		{fmt.Sprintf("`__ping`, %d callers", cfg.pingCallers), func(ctx context.Context, c *rpcClient) (RunStats, error) {
			rs, _, err := pingRun(ctx, c, cfg.pingCallers, cfg.pingConcN)
			return rs, err
		}},
		{"`box_exec`, 64 KiB answer", func(ctx context.Context, c *rpcClient) (RunStats, error) {
			return execRun(ctx, c, cfg.execNCLI, 64<<10)
		}},
	}
	rows := make([]Row, len(variants))
	for i, v := range variants {
		rows[i] = Row{Case: v.name, Boxrt: newMeasure("boxrt box -s (envelope)"), Base: newMeasure("boxrt serve --stdio (JSON-RPC)")}
	}
	measure := func(m *Measure, start func() (*rpcClient, func(), error), run func(context.Context, *rpcClient) (RunStats, error)) {
		c, stop, err := start()
		if err != nil {
			m.fail(err)
			return
		}
		defer stop()
		rs, err := run(ctx, c)
		if err != nil {
			m.fail(err)
			return
		}
		m.add(rs)
	}
	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		for i, v := range variants {
			measure(rows[i].Boxrt, func() (*rpcClient, func(), error) { return b.startLangBot(ctx) }, v.run)
			measure(rows[i].Base, func() (*rpcClient, func(), error) {
				p, err := b.startBoxrt(ctx, boxrtOpts{Name: "langbot-base", Stdio: true, Config: `{"backend":"bwrap"}`})
				if err != nil {
					return nil, nil, err
				}
				return p.rpc, func() { _ = p.stop(10 * time.Second) }, nil
			}, v.run)
			b.logf("langbot %s rep %d: envelope p50 %s, JSON-RPC p50 %s", v.name, rep+1, lastP50(rows[i].Boxrt), lastP50(rows[i].Base))
		}
	}
	sc.Rows = rows
	return sc
}
