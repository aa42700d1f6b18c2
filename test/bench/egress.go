package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The egress scenario runs boxrt in a network namespace of its own whose
// loopback carries the server's address (TEST-NET-3, named api.test by
// egress.hosts), so nothing leaves the machine. One bwrap session with the
// policy {"allow": ["api.test"]} runs the client through the egress proxy;
// the baseline runs the same client in boxrt's namespace, straight to the
// server.
const (
	egressServerIP = "203.0.113.10"
	egressName     = "api.test"
)

// egressLatencyPy makes argv[3] requests, a fresh connection each, to
// argv[1]:argv[2] (resolved once) and prints each one's time in ns.
const egressLatencyPy = `import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
addr = socket.gethostbyname(host)
req = ("GET / HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" % (host, port)).encode()
out = []
for _ in range(n):
    t = time.perf_counter_ns()
    s = socket.create_connection((addr, port))
    s.sendall(req)
    while s.recv(65536):
        pass
    s.close()
    out.append(time.perf_counter_ns() - t)
print(" ".join(str(x) for x in out))`

// egressBulkPy downloads /bulk from argv[1]:argv[2] and prints the time
// in ns and the bytes.
const egressBulkPy = `import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
addr = socket.gethostbyname(host)
buf = bytearray(1 << 20)
t = time.perf_counter_ns()
s = socket.create_connection((addr, port))
s.sendall(("GET /bulk HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" % (host, port)).encode())
n = 0
while True:
    k = s.recv_into(buf)
    if not k:
        break
    n += k
print(time.perf_counter_ns() - t, n)`

func (b *bench) scenarioEgress(ctx context.Context) *Scenario {
	cfg := b.cfg
	requests, bulkMiB, downloads := 300, 256, 3
	if cfg.quick {
		requests, bulkMiB, downloads = 60, 64, 2
	}
	sc := &Scenario{Title: "Egress proxy: an allowed HTTP request and a bulk download"}
	sc.Intro = fmt.Sprintf("boxrt serves bwrap in a network namespace of its own, whose loopback holds the HTTP server "+
		"(`%s`, named `%s` by `egress.hosts`). Per run, a Python client in a session with network `{\"allow\": [\"%s\"]}` "+
		"makes %d requests, a fresh connection each (p50 per request), and downloads %d MiB %d times (time per download), "+
		"all through the egress proxy (nftables redirect, name check, splice). **Baseline:** the same client in boxrt's "+
		"namespace, straight to the server. **Floor:** the same client in boxrt's namespace through a bare splice relay "+
		"in the harness (two TCP connections joined by splice(2): no redirect, no name check, no HTTP), the cheapest any "+
		"proxy with one extra loopback hop can be here. On this machine both ends are local, so the proxy's extra loopback hop costs "+
		"CPU the baseline does not spend; across a real network the link, not the hop, bounds the download.",
		egressServerIP, egressName, egressName, requests, bulkMiB, downloads)
	reqBox, reqBase := newMeasure("through the proxy"), newMeasure("direct")
	bulkBox, bulkBase := newMeasure("through the proxy"), newMeasure("direct")
	reqFloor, bulkFloor := newMeasure("bare splice relay"), newMeasure("bare splice relay")
	sc.Rows = []Row{{Case: "HTTP request, fresh connection", Boxrt: reqBox, Base: reqBase},
		{Case: fmt.Sprintf("download of %d MiB", bulkMiB), Boxrt: bulkBox, Base: bulkBase},
		{Case: "HTTP request, against the floor", Boxrt: reqBox, Base: reqFloor},
		{Case: fmt.Sprintf("download of %d MiB, against the floor", bulkMiB), Boxrt: bulkBox, Base: bulkFloor}}
	if !b.wantBackend("bwrap") {
		sc.Skipped = skippedBackend
		return sc
	}
	if os.Geteuid() != 0 {
		sc.Skipped = "needs root (a network namespace for the server; bwrap sessions with network)"
		return sc
	}
	ns, err := newBenchNetns()
	if err != nil {
		sc.Skipped = "cannot make the network namespace: " + err.Error()
		return sc
	}
	defer ns.Close()
	port, stopServer, err := egressServe(ns, int64(bulkMiB)<<20)
	if err != nil {
		sc.Skipped = "cannot start the server: " + err.Error()
		return sc
	}
	defer stopServer()
	floorPort, stopFloor, err := egressFloor(ns, port)
	if err != nil {
		sc.Skipped = "cannot start the splice relay: " + err.Error()
		return sc
	}
	defer stopFloor()
	var p *boxrtProc
	err = inNetns(ns, func() error {
		var err error
		p, err = b.startBoxrt(ctx, boxrtOpts{Name: "egress", Stdio: true,
			Config: fmt.Sprintf(`{"backend":"bwrap","egress":{"hosts":{%q:%q}}}`, egressName, egressServerIP)})
		return err
	})
	if err != nil {
		sc.Skipped = err.Error()
		return sc
	}
	defer p.stop(10 * time.Second)
	viaProxy := func(script string, args ...string) (string, error) {
		var r struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
			Stderr   string `json:"stderr"`
		}
		err := p.rpc.CallInto(ctx, "box_exec", map[string]any{"session_id": "egress", "network": map[string]any{"allow": []string{egressName}},
			"timeout_sec": 600, "cmd": "python3 -c '" + script + "' " + strings.Join(args, " ")}, &r)
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", r.ExitCode, firstLine(r.Stderr))
		}
		return r.Stdout, err
	}
	direct := func(script string, args ...string) (string, error) {
		var out []byte
		err := inNetns(ns, func() error {
			var err error
			out, err = exec.CommandContext(ctx, "python3", append([]string{"-c", script}, args...)...).Output()
			return err
		})
		return string(out), err
	}
	legs := []egressLeg{{viaProxy, egressName, port, reqBox, bulkBox}, {direct, egressServerIP, port, reqBase, bulkBase},
		{direct, "127.0.0.1", floorPort, reqFloor, bulkFloor}}
	for rep := 0; rep < cfg.reps; rep++ {
		b.logf("egress: run %d/%d", rep+1, cfg.reps)
		for _, leg := range legs {
			leg.measure(requests, downloads, int64(bulkMiB)<<20)
		}
	}
	table := "| case | through the proxy MiB/s | direct MiB/s | bare splice relay MiB/s |\n|---|---:|---:|---:|\n"
	table += fmt.Sprintf("| download of %d MiB | %s | %s | %s |\n", bulkMiB, mibPerSec(bulkBox, bulkMiB),
		mibPerSec(bulkBase, bulkMiB), mibPerSec(bulkFloor, bulkMiB))
	sc.Tables = append(sc.Tables, table)
	sc.Goals = egressGoals(reqBox, reqBase, bulkBox, bulkBase, bulkMiB)
	return sc
}

// egressLeg is one way to run the clients: through the proxy or direct.
type egressLeg struct {
	run       func(script string, args ...string) (string, error)
	host      string
	port      int
	req, bulk *Measure
}

// measure runs the request client once and the download downloads times.
func (leg egressLeg) measure(requests, downloads int, bulk int64) {
	port := strconv.Itoa(leg.port)
	out, err := leg.run(egressLatencyPy, leg.host, port, strconv.Itoa(requests))
	if err == nil {
		var samples []time.Duration
		if samples, err = parseNanos(out); err == nil {
			addSamples(leg.req, samples)
		}
	}
	if err != nil {
		leg.req.fail(err)
	}
	var times []time.Duration
	for i := 0; i < downloads; i++ {
		out, err := leg.run(egressBulkPy, leg.host, port)
		var ns, n int64
		if err == nil {
			_, err = fmt.Sscan(out, &ns, &n)
		}
		if err == nil && n < bulk {
			err = fmt.Errorf("downloaded %d bytes", n)
		}
		if err != nil {
			leg.bulk.fail(err)
			continue
		}
		times = append(times, time.Duration(ns))
	}
	addSamples(leg.bulk, times)
}

// egressGoals: the proxy adds at most 1 ms to a request (p50) and keeps
// 0.8× of the direct download rate.
func egressGoals(reqBox, reqBase, bulkBox, bulkBase *Measure, bulkMiB int) []Goal {
	added := Goal{Text: "the egress proxy adds at most 1 ms to an allowed HTTP request (p50, fresh connection)", Measured: "not measured"}
	if reqBox.ok() && reqBase.ok() {
		d := reqBox.P50() - reqBase.P50()
		added.Measured = fmt.Sprintf("%s vs %s direct: +%s", fmtDur(reqBox.P50()), fmtDur(reqBase.P50()), fmtDur(d))
		added.Met = boolp(d <= time.Millisecond)
	}
	throughput := Goal{Text: "download through the egress proxy at least 0.8× direct", Measured: "not measured"}
	if bulkBox.ok() && bulkBase.ok() {
		r := ratio(float64(bulkBase.P50()), float64(bulkBox.P50()))
		throughput.Measured = fmt.Sprintf("%s vs %s MiB/s = %.2f×", mibPerSec(bulkBox, bulkMiB), mibPerSec(bulkBase, bulkMiB), r)
		throughput.Met = boolp(r >= 0.8)
	}
	return []Goal{added, throughput}
}

func parseNanos(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Fields(s) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("client output %q", firstLine(s))
		}
		out = append(out, time.Duration(n))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no samples")
	}
	return out, nil
}

// newBenchNetns makes a network namespace with lo up and the server's
// address on it.
func newBenchNetns() (*os.File, error) {
	type made struct {
		f   *os.File
		err error
	}
	ch := make(chan made, 1)
	go func() {
		// Never unlocked: the thread, in the new namespace, ends with the
		// goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- made{err: err}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if err == nil {
			err = loopbackWith(egressServerIP)
		}
		ch <- made{f, err}
	}()
	m := <-ch
	return m.f, m.err
}

func loopbackWith(ip string) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	addr, err := netlink.ParseAddr(ip + "/32")
	if err != nil {
		return err
	}
	return netlink.AddrAdd(lo, addr)
}

// inNetns runs f on a thread of its own in ns (sockets it opens and
// processes it starts live there); the thread is discarded afterwards.
func inNetns(ns *os.File, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

// egressFloor puts a bare splice relay (spliceRelay) on 127.0.0.1 in ns
// in front of the server's port; it returns the relay's port. Its dials
// come from one thread parked in ns, as boxrt's come from its own
// namespace without entering another.
func egressFloor(ns *os.File, port int) (int, func(), error) {
	type dialed struct {
		c   net.Conn
		err error
	}
	target := net.JoinHostPort(egressServerIP, strconv.Itoa(port))
	dials := make(chan chan dialed)
	ready := make(chan error, 1)
	var ln net.Listener
	go func() {
		// Never unlocked: the thread, in ns, ends with the goroutine.
		runtime.LockOSThread()
		err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET)
		if err == nil {
			ln, err = net.Listen("tcp4", "127.0.0.1:0")
		}
		ready <- err
		if err != nil {
			return
		}
		for reply := range dials {
			c, err := net.Dial("tcp4", target)
			reply <- dialed{c, err}
		}
	}()
	if err := <-ready; err != nil {
		return 0, nil, err
	}
	stop := spliceRelay(ln, func() (net.Conn, error) {
		reply := make(chan dialed, 1)
		dials <- reply
		d := <-reply
		return d.c, d.err
	})
	return ln.Addr().(*net.TCPAddr).Port, func() { stop(); close(dials) }, nil
}

// egressServe serves "/" (a short body) and "/bulk" (bulk zero bytes) on
// the server's address in ns.
func egressServe(ns *os.File, bulk int64) (int, func(), error) {
	var ln net.Listener
	if err := inNetns(ns, func() (err error) {
		ln, err = net.Listen("tcp4", egressServerIP+":0")
		return err
	}); err != nil {
		return 0, nil, err
	}
	chunk := make([]byte, 1<<20)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/bulk", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.FormatInt(bulk, 10))
		for left := bulk; left > 0; left -= int64(len(chunk)) {
			if _, err := w.Write(chunk[:min(left, int64(len(chunk)))]); err != nil {
				return
			}
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	return ln.Addr().(*net.TCPAddr).Port, func() { _ = srv.Close(); <-done }, nil
}
