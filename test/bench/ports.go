package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// portsBigMiB is the throughput case's download.
const portsBigMiB = 64

// portsServerPort is where python3's http.server listens, in the session
// and (the baseline) on the host.
const portsServerPort = 8000

func (b *bench) scenarioPorts(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "Port proxy (bwrap backend)"}
	sc.Intro = fmt.Sprintf(`A bwrap session with network off runs `+"`python3 -m http.server`"+` on 127.0.0.1:%d; the harness exposes the port
(`+"`box_expose_port`"+`) and requests it through boxrt's listener with the port's token in `+"`X-Boxrt-Port-Token`"+`.
- *Small request*: %d sequential GETs of a 100-byte file; latency is request sent → body read.
- *Throughput*: GETs of a %d MiB file of random bytes, read to the end; ops/s is MiB/s.
**Baseline:** the same `+"`python3 -m http.server`"+` on the host's loopback, requested directly. http.server speaks HTTP/1.0
and closes every connection, so each proxied request also pays boxrt's dial into the session's network namespace.
**Floor:** the host's server through a bare splice relay in the harness (two TCP connections joined by splice(2), no HTTP):
the cheapest any proxy with one loopback hop can be on this machine.`,
		portsServerPort, cfg.relayN, portsBigMiB)
	small, smallDirect := newMeasure("boxrt port proxy"), newMeasure("direct loopback")
	big, bigDirect := newMeasure("boxrt port proxy, MiB/s"), newMeasure("direct loopback, MiB/s")
	bigFloor := newMeasure("bare splice relay, MiB/s")
	sc.Rows = []Row{
		{Case: "small GET (100 bytes)", Boxrt: small, Base: smallDirect},
		{Case: fmt.Sprintf("%d MiB GET, MiB/s", portsBigMiB), Boxrt: big, Base: bigDirect},
		{Case: fmt.Sprintf("%d MiB GET, MiB/s, against the floor", portsBigMiB), Boxrt: big, Base: bigFloor},
	}
	cpuPerMiB := b.portsRun(ctx, small, smallDirect, big, bigDirect, bigFloor)
	if cpuPerMiB > 0 {
		sc.Notes = append(sc.Notes, fmt.Sprintf("boxrt's own CPU time per MiB proxied in the throughput case: %s (user and system, all threads; "+
			"the rest of the gap to the direct download is the extra hop's scheduling and copies on this machine's cores)", fmtDur(cpuPerMiB)))
	}

	g := Goal{Text: "the port proxy adds at most 1 ms at p50 to a small HTTP request (proxy minus direct loopback)", Measured: "not measured"}
	if small.ok() && smallDirect.ok() {
		added := small.P50() - smallDirect.P50()
		g.Measured = fmt.Sprintf("adds %s (%s vs %s)", fmtDur(max(added, 1)), fmtDur(small.P50()), fmtDur(smallDirect.P50()))
		g.Met = boolp(added <= time.Millisecond)
	}
	gt := Goal{Text: "the port proxy's throughput is at least 0.8× a direct loopback download", Measured: "not measured"}
	if big.ok() && bigDirect.ok() {
		ratio := big.OpsPerSec() / bigDirect.OpsPerSec()
		gt.Measured = fmt.Sprintf("%.2f× (%.0f vs %.0f MiB/s)", ratio, big.OpsPerSec(), bigDirect.OpsPerSec())
		gt.Met = boolp(ratio >= 0.8)
	}
	sc.Goals = []Goal{g, gt}
	return sc
}

// portsRun starts one boxrt and one host server, and measures both cfg.reps
// times; it returns boxrt's CPU time per MiB of the proxied downloads.
func (b *bench) portsRun(ctx context.Context, small, smallDirect, big, bigDirect, bigFloor *Measure) (cpuPerMiB time.Duration) {
	all := []*Measure{small, smallDirect, big, bigDirect, bigFloor}
	unavailable := func(err error) {
		for _, m := range all {
			m.Unavailable = err.Error()
		}
	}
	dir := filepath.Join(b.workDir, "ports-www")
	if err := portsFiles(dir); err != nil {
		unavailable(err)
		return 0
	}
	defer os.RemoveAll(dir)
	direct, stop, err := hostHTTPServer(ctx, dir)
	if err != nil {
		unavailable(err)
		return 0
	}
	defer stop()
	floor, stopFloor, err := floorRelay(direct)
	if err != nil {
		unavailable(err)
		return 0
	}
	defer stopFloor()
	p, err := b.startBackend(ctx, "ports", "bwrap", true, nil)
	if err != nil {
		unavailable(err)
		return 0
	}
	defer p.stop(30 * time.Second)
	proxied, token, err := b.portsSession(ctx, p)
	if err != nil {
		unavailable(err)
		return 0
	}
	defer deleteSession(context.Background(), p.rpc, "bench-ports")
	client := &http.Client{Timeout: time.Minute}
	var spent time.Duration
	for rep := 0; rep < b.cfg.reps && ctx.Err() == nil; rep++ {
		portsSmall(ctx, client, proxied, token, small, b.cfg.relayN)
		portsSmall(ctx, client, direct, "", smallDirect, b.cfg.relayN)
		cpu0, _, cerr := procCPU(p.cmd.Process.Pid)
		portsBig(ctx, client, proxied, token, big)
		if cpu1, _, err := procCPU(p.cmd.Process.Pid); cerr == nil && err == nil {
			spent += cpu1 - cpu0
		}
		portsBig(ctx, client, direct, "", bigDirect)
		portsBig(ctx, client, floor, "", bigFloor)
		b.logf("ports rep %d: small proxy %s, direct %s; %d MiB proxy %s MiB/s, direct %s MiB/s, splice relay %s MiB/s", rep+1,
			lastP50(small), lastP50(smallDirect), portsBigMiB, lastOps(big), lastOps(bigDirect), lastOps(bigFloor))
	}
	if n := len(big.Runs); n > 0 {
		return spent / time.Duration(n*portsBigMiB)
	}
	return 0
}

// floorRelay puts a bare splice relay (spliceRelay) on a free loopback
// port in front of the server at base; it returns the relay's base URL.
func floorRelay(base string) (string, func(), error) {
	target := strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/")
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	stop := spliceRelay(ln, func() (net.Conn, error) { return net.Dial("tcp4", target) })
	return "http://" + ln.Addr().String() + "/", stop, nil
}

// portsFiles writes the two files served.
func portsFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "small"), make([]byte, 100), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "big"))
	if err != nil {
		return err
	}
	_, err = io.CopyN(f, rand.Reader, portsBigMiB<<20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// hostHTTPServer runs python3's http.server on a free loopback port
// serving dir; it returns its base URL once it answers.
func hostHTTPServer(ctx context.Context, dir string) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.CommandContext(ctx, "python3", "-m", "http.server", strconv.Itoa(port), "--bind", "127.0.0.1", "--directory", dir)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("python3 http.server on the host: %w", err)
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	base := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	for i := 0; i < 100; i++ {
		if resp, err := http.Get(base + "small"); err == nil {
			resp.Body.Close()
			return base, stop, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return "", nil, fmt.Errorf("python3 http.server on the host did not answer")
}

// portsSession makes the session, its files and server, and exposes the
// port: the proxied base URL and the token.
func (b *bench) portsSession(ctx context.Context, p *boxrtProc) (string, string, error) {
	const sid = "bench-ports"
	if _, err := p.rpc.Call(ctx, "box_create_session", map[string]any{"session_id": sid, "network": "off"}); err != nil {
		return "", "", fmt.Errorf("box_create_session: %w", err)
	}
	setup := fmt.Sprintf("mkdir -p /tmp/www && head -c 100 /dev/zero > /tmp/www/small && head -c %d /dev/urandom > /tmp/www/big", portsBigMiB<<20)
	if _, err := p.rpc.Call(ctx, "box_exec", map[string]any{"session_id": sid, "cmd": setup, "timeout_sec": 120}); err != nil {
		return "", "", fmt.Errorf("box_exec: %w", err)
	}
	spec := map[string]any{"process_id": "http", "command": "python3",
		"args": []string{"-m", "http.server", strconv.Itoa(portsServerPort), "--bind", "127.0.0.1", "--directory", "/tmp/www"}}
	if _, err := p.rpc.Call(ctx, "box_start_managed_process", map[string]any{"session_id": sid, "spec": spec}); err != nil {
		return "", "", fmt.Errorf("box_start_managed_process: %w", err)
	}
	var x struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	}
	if err := p.rpc.CallInto(ctx, "box_expose_port", map[string]any{"session_id": sid, "port": portsServerPort}, &x); err != nil {
		return "", "", fmt.Errorf("box_expose_port: %w", err)
	}
	for i := 0; i < 100; i++ {
		if status, err := portsGet(ctx, http.DefaultClient, x.URL+"small", x.Token); err == nil && status == http.StatusOK {
			return x.URL, x.Token, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", "", fmt.Errorf("the session's http.server did not answer through the proxy")
}

// portsGet requests url and reads the body to its end.
func portsGet(ctx context.Context, c *http.Client, url, token string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	if token != "" {
		req.Header.Set("X-Boxrt-Port-Token", token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

func portsSmall(ctx context.Context, c *http.Client, base, token string, m *Measure, n int) {
	samples := make([]time.Duration, 0, n)
	for i := 0; i < 20; i++ { // warm-up
		_, _ = portsGet(ctx, c, base+"small", token)
	}
	t0 := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		s := time.Now()
		status, err := portsGet(ctx, c, base+"small", token)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("status %d", status)
		}
		if err != nil {
			m.fail(err)
			return
		}
		samples = append(samples, time.Since(s))
	}
	m.add(summarise(samples, time.Since(t0)))
}

func portsBig(ctx context.Context, c *http.Client, base, token string, m *Measure) {
	t0 := time.Now()
	status, err := portsGet(ctx, c, base+"big", token)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("status %d", status)
	}
	if err != nil {
		m.fail(err)
		return
	}
	d := time.Since(t0)
	m.add(RunStats{N: 1, P50: d, P99: d, Throughput: portsBigMiB / d.Seconds()})
}
