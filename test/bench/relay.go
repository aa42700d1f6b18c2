package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// streamLine is what the streaming producer prints, one per line.
const streamLine = `{"jsonrpc":"2.0"}`

// stallLineBytes is the line the slow-reader case's producer prints: long
// enough that the replay buffer's byte bound (relay_replay_bytes, 4 MiB by
// default) binds before its line bound (4096).
const stallLineBytes = 2048

// replayBytesKiB is limits.relay_replay_bytes's default, the bound the
// slow-reader goal holds boxrt to.
const replayBytesKiB = 4096

// stallStats is the slow-reader case: boxrt's RSS while a producer's
// replay buffer is full and nobody is attached, and its highest RSS while
// an attached reader reads nothing.
type stallStats struct {
	detached, peak []float64 // KiB
}

func (b *bench) scenarioRelay(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "Relay to a managed process (bwrap backend)"}
	sc.Intro = fmt.Sprintf(`boxrt runs with the bwrap backend, its HTTP listener on 127.0.0.1:0 and a control token; the harness starts a
managed process with `+"`box_start_managed_process`"+` and attaches to
`+"`/v1/sessions/{sid}/managed-process/{pid}/ws`"+` with `+"`Authorization: Bearer …`"+`.
- *Round trip*: %d sequential one-line JSON-RPC messages (~60 bytes) sent as text frames to a `+"`cat`"+` managed process;
  latency is frame written → the echoed line read back as a frame.
  **Baseline:** the same messages through a direct pipe to a local `+"`cat`"+` (write the line, read the line).
- *Streaming*: a managed process runs `+"`yes '%s'`"+`; after 0.3 s of warm-up the harness counts the frames it
  receives for %.1f s (one frame per line). **Baseline:** the same `+"`yes`"+` read line by line from a direct pipe.
  The ops/s column is frames (lines) per second; latency columns do not apply.`,
		cfg.relayN, streamLine, cfg.streamSec)

	rttBox := newMeasure("boxrt relay → cat")
	rttPipe := newMeasure("direct pipe → cat")
	strBox := newMeasure("boxrt relay ← yes")
	stall := &stallStats{}
	strPipe := newMeasure("direct pipe ← yes")
	sc.Rows = []Row{
		{Case: "round trip, one-line message", Boxrt: rttBox, Base: rttPipe},
		{Case: "streaming producer, frames/s", Boxrt: strBox, Base: strPipe},
	}

	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		if rttBox.Unavailable == "" {
			b.relayRun(ctx, rep, rttBox, strBox, stall)
		}
		pipeRTT(ctx, rttPipe, cfg.relayN)
		pipeStream(ctx, strPipe, cfg.streamSec)
		b.logf("relay rep %d: rtt boxrt %s, pipe %s; stream boxrt %s/s, pipe %s/s", rep+1, lastP50(rttBox), lastP50(rttPipe),
			lastOps(strBox), lastOps(strPipe))
	}
	if rttBox.Unavailable != "" {
		strBox.Unavailable = rttBox.Unavailable
	}
	g := Goal{Text: "relay adds under 1 ms at p50 (round trip, boxrt relay minus direct pipe)"}
	if rttBox.ok() && rttPipe.ok() {
		added := rttBox.P50() - rttPipe.P50()
		g.Measured = fmt.Sprintf("adds %s (%s vs %s)", fmtDur(max(added, 1)), fmtDur(rttBox.P50()), fmtDur(rttPipe.P50()))
		g.Met = boolp(added < time.Millisecond)
	} else {
		g.Measured = "not measured"
	}
	gs := Goal{Text: "relay streaming: at least 300 k frames/s (one frame per line)"}
	if strBox.ok() {
		gs.Measured = fmt.Sprintf("%s frames/s (direct pipe %s lines/s)", fmtOps(strBox.OpsPerSec()), fmtOps(strPipe.OpsPerSec()))
		gs.Met = boolp(strBox.OpsPerSec() >= 300000)
	} else {
		gs.Measured = "not measured"
	}
	gr := Goal{Text: fmt.Sprintf("a stalled relay reader grows boxrt's RSS by at most the replay bound (relay_replay_bytes, %s)", fmtKiB(replayBytesKiB))}
	if len(stall.peak) > 0 {
		grow := median(stall.peak) - median(stall.detached)
		growth := "0.0 KiB" // fmtKiB reads 0 as missing
		if grow > 0 {
			growth = fmtKiB(grow)
		}
		gr.Measured = fmt.Sprintf("+%s (RSS %s detached with a full replay buffer, peak %s while the reader stalled)",
			growth, fmtKiB(median(stall.detached)), fmtKiB(median(stall.peak)))
		gr.Met = boolp(grow <= replayBytesKiB)
	} else {
		gr.Measured = "not measured"
	}
	sc.Intro += fmt.Sprintf(`
- *Slow reader*: a managed process runs `+"`yes`"+` with a %d-byte line; after 1 s detached (its replay buffer full, the oldest
  lines dropping) the harness reads boxrt's VmRSS, attaches and then reads nothing for %.1f s while sampling VmRSS every 20 ms.
  Lines for an attached reader wait in a queue held, with the batch being sent, to the replay bounds: the process is then
  held back, not buffered.`, stallLineBytes, stallSec(cfg))
	sc.Goals = []Goal{g, gs, gr}
	sc.Breakdown = whereTimeGoesRelay
	return sc
}

// stallSec is how long the slow reader stalls.
func stallSec(cfg config) float64 { return max(2, 2*cfg.streamSec) }

func lastOps(m *Measure) string {
	if len(m.Runs) == 0 {
		return "n/a"
	}
	return fmtOps(m.Runs[len(m.Runs)-1].Throughput)
}

// relayRun is one run against a fresh boxrt: the round trips, then the
// streaming count.
func (b *bench) relayRun(ctx context.Context, rep int, rtt, stream *Measure, stall *stallStats) {
	p, err := b.startBackend(ctx, "relay", "bwrap", true, nil)
	if err != nil {
		rtt.Unavailable = err.Error()
		return
	}
	defer p.stop(30 * time.Second)
	sid := fmt.Sprintf("bench-relay-%d", rep)
	if _, err := p.rpc.Call(ctx, "box_create_session", map[string]any{"session_id": sid}); err != nil {
		rtt.fail(fmt.Errorf("box_create_session: %w", err))
		return
	}
	defer deleteSession(context.Background(), p.rpc, sid)

	// round trips through cat
	func() {
		conn, err := b.startRelayProcess(ctx, p, sid, map[string]any{"process_id": "cat", "command": "cat"})
		if err != nil {
			rtt.fail(err)
			return
		}
		defer conn.CloseNow()
		defer p.rpc.Call(context.Background(), "box_stop_managed_process", map[string]string{"session_id": sid, "process_id": "cat"})
		var samples []time.Duration
		msg := make([]byte, 0, 96)
		for i := 0; i < 50; i++ { // warm-up
			if _, err := relayEcho(ctx, conn, append(msg[:0], fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"bench/echo","params":{}}`, i)...)); err != nil {
				rtt.fail(err)
				return
			}
		}
		t0 := time.Now()
		for i := 0; i < b.cfg.relayN && ctx.Err() == nil; i++ {
			m := append(msg[:0], `{"jsonrpc":"2.0","id":`...)
			m = strconv.AppendInt(m, int64(i), 10)
			m = append(m, `,"method":"bench/echo","params":{}}`...)
			d, err := relayEcho(ctx, conn, m)
			if err != nil {
				rtt.fail(err) // a broken socket stays broken: end the run
				break
			}
			samples = append(samples, d)
		}
		if len(samples) > 0 {
			rtt.add(summarise(samples, time.Since(t0)))
		}
	}()

	// streaming from yes
	func() {
		conn, err := b.startRelayProcess(ctx, p, sid, map[string]any{"process_id": "yes", "command": "yes", "args": []string{streamLine}})
		if err != nil {
			stream.fail(err)
			return
		}
		defer conn.CloseNow()
		defer p.rpc.Call(context.Background(), "box_stop_managed_process", map[string]string{"session_id": sid, "process_id": "yes"})
		n, d, err := countFrames(ctx, conn, b.cfg.streamSec)
		if err != nil {
			stream.fail(err)
			return
		}
		stream.add(RunStats{N: n, Throughput: float64(n) / d.Seconds()})
	}()

	// a reader that stalls
	func() {
		var info struct {
			ProcessID string `json:"process_id"`
		}
		spec := map[string]any{"process_id": "stall", "command": "yes", "args": []string{strings.Repeat("x", stallLineBytes-1)}}
		if err := p.rpc.CallInto(ctx, "box_start_managed_process", map[string]any{"session_id": sid, "spec": spec}, &info); err != nil {
			stream.fail(fmt.Errorf("box_start_managed_process: %w", err))
			return
		}
		defer p.rpc.Call(context.Background(), "box_stop_managed_process", map[string]string{"session_id": sid, "process_id": "stall"})
		time.Sleep(time.Second)
		detached, err := rssKiB(p.pid())
		if err != nil {
			stream.fail(err)
			return
		}
		conn, err := b.dialRelay(ctx, p, sid, "stall")
		if err != nil {
			stream.fail(err)
			return
		}
		defer conn.CloseNow()
		peak := detached
		end := time.Now().Add(time.Duration(stallSec(b.cfg) * float64(time.Second)))
		for time.Now().Before(end) && ctx.Err() == nil {
			if v, err := rssKiB(p.pid()); err == nil {
				peak = max(peak, v)
			}
			time.Sleep(20 * time.Millisecond)
		}
		stall.detached = append(stall.detached, float64(detached))
		stall.peak = append(stall.peak, float64(peak))
		b.logf("relay stall: RSS detached %s, peak while stalled %s", fmtKiB(float64(detached)), fmtKiB(float64(peak)))
	}()
}

// startRelayProcess starts a managed process and attaches to it.
func (b *bench) startRelayProcess(ctx context.Context, p *boxrtProc, sid string, spec map[string]any) (*websocket.Conn, error) {
	var info struct {
		ProcessID string `json:"process_id"`
	}
	if err := p.rpc.CallInto(ctx, "box_start_managed_process", map[string]any{"session_id": sid, "spec": spec}, &info); err != nil {
		return nil, fmt.Errorf("box_start_managed_process: %w", err)
	}
	pid := info.ProcessID
	if pid == "" {
		pid, _ = spec["process_id"].(string)
	}
	return b.dialRelay(ctx, p, sid, pid)
}

// dialRelay attaches to a managed process with the control token.
func (b *bench) dialRelay(ctx context.Context, p *boxrtProc, sid, pid string) (*websocket.Conn, error) {
	u := fmt.Sprintf("ws://%s/v1/sessions/%s/managed-process/%s/ws", p.addr, url.PathEscape(sid), url.PathEscape(pid))
	h := http.Header{}
	h.Set("Authorization", "Bearer "+b.token)
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		detail := ""
		if resp != nil && resp.Body != nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 500))
			detail = " " + string(body)
		}
		return nil, fmt.Errorf("relay attach %s: %v%s", u, err, detail)
	}
	conn.SetReadLimit(16 << 20)
	return conn, nil
}

func relayEcho(ctx context.Context, c *websocket.Conn, msg []byte) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := c.Write(rctx, websocket.MessageText, msg); err != nil {
		return 0, err
	}
	_, got, err := c.Read(rctx)
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if !bytes.Equal(bytes.TrimRight(got, "\n"), msg) {
		return 0, fmt.Errorf("relay echoed %q, want %q", truncate(string(got), 100), msg)
	}
	return d, nil
}

// countFrames reads frames for 0.3 s of warm-up, then counts them for sec
// seconds. Reads take a context without a deadline: with one the websocket
// library arms and disarms a timer per frame, which costs this reader more
// than boxrt spends relaying the frame. A timer closing the socket bounds
// the whole count instead.
func countFrames(ctx context.Context, c *websocket.Conn, sec float64) (int, time.Duration, error) {
	rctx := context.WithoutCancel(ctx)
	guard := context.AfterFunc(ctx, func() { c.CloseNow() })
	defer guard()
	watchdog := time.AfterFunc(time.Duration(sec*float64(time.Second))+15*time.Second, func() { c.CloseNow() })
	defer watchdog.Stop()
	warmEnd := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(warmEnd) {
		if _, _, err := c.Read(rctx); err != nil {
			return 0, 0, err
		}
	}
	n := 0
	t0 := time.Now()
	end := t0.Add(time.Duration(sec * float64(time.Second)))
	for {
		_, msg, err := c.Read(rctx)
		if err != nil {
			return 0, 0, err
		}
		if n == 0 && !bytes.HasPrefix(msg, []byte(streamLine)) {
			return 0, 0, fmt.Errorf("unexpected frame %q", truncate(string(msg), 100))
		}
		n++
		if n%64 == 0 && time.Now().After(end) {
			break
		}
	}
	return n, time.Since(t0), nil
}

// pipeRTT is the baseline: the same lines through a local cat.
func pipeRTT(ctx context.Context, m *Measure, n int) {
	cmd := exec.CommandContext(ctx, "cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		m.fail(err)
		return
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		m.fail(err)
		return
	}
	if err := cmd.Start(); err != nil {
		m.Unavailable = err.Error()
		return
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	r := bufio.NewReaderSize(stdout, 64<<10)
	one := func(i int) (time.Duration, error) {
		msg := []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"bench/echo","params":{}}`+"\n", i))
		t0 := time.Now()
		if _, err := stdin.Write(msg); err != nil {
			return 0, err
		}
		got, err := r.ReadBytes('\n')
		d := time.Since(t0)
		if err != nil {
			return 0, err
		}
		if !bytes.Equal(got, msg) {
			return 0, fmt.Errorf("cat echoed %q", got)
		}
		return d, nil
	}
	for i := 0; i < 50; i++ {
		if _, err := one(i); err != nil {
			m.fail(err)
			return
		}
	}
	var samples []time.Duration
	t0 := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		d, err := one(i)
		if err != nil {
			m.fail(err)
			return
		}
		samples = append(samples, d)
	}
	m.add(summarise(samples, time.Since(t0)))
}

// pipeStream is the baseline: yes read line by line from a pipe.
func pipeStream(ctx context.Context, m *Measure, sec float64) {
	cmd := exec.CommandContext(ctx, "yes", streamLine)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		m.fail(err)
		return
	}
	if err := cmd.Start(); err != nil {
		m.Unavailable = err.Error()
		return
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	r := bufio.NewReaderSize(stdout, 64<<10)
	warmEnd := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(warmEnd) {
		if _, err := r.ReadBytes('\n'); err != nil {
			m.fail(err)
			return
		}
	}
	n := 0
	t0 := time.Now()
	end := t0.Add(time.Duration(sec * float64(time.Second)))
	for {
		line, err := r.ReadBytes('\n') // one allocation per line, like one frame per message
		if err != nil {
			m.fail(err)
			return
		}
		if n == 0 && !bytes.HasPrefix(line, []byte(streamLine)) {
			m.fail(fmt.Errorf("unexpected line %q", line))
			return
		}
		n++
		if n%64 == 0 && time.Now().After(end) {
			break
		}
	}
	d := time.Since(t0)
	m.add(RunStats{N: n, Throughput: float64(n) / d.Seconds()})
}
