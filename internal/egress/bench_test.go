package egress

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The proxy's cost, measured against the same client going straight to
// the server from boxrt's namespace: a fresh connection with one small
// request (the added latency, p50) and a bulk download (throughput).
//
//	go test -run '^$' -bench . ./internal/egress/

func BenchmarkRequest(b *testing.B) {
	startServer(b, apiAddr+":8080", "api", nil, "")
	b.Run("direct", func(b *testing.B) { benchRequests(b, hostDialer(b)) })
	b.Run("proxy", func(b *testing.B) { benchRequests(b, proxyDialer(b)) })
}

func BenchmarkThroughput(b *testing.B) {
	startServer(b, apiAddr+":8080", "api", nil, "")
	b.Run("direct", func(b *testing.B) { benchBulk(b, hostDialer(b)) })
	b.Run("proxy", func(b *testing.B) { benchBulk(b, proxyDialer(b)) })
}

// nsDialer dials from a thread parked in one network namespace, so both
// sides of the comparison pay the same hand-off.
type nsDialer chan chan net.Conn

func newNSDialer(b *testing.B, ns *os.File, addr string) nsDialer {
	d := make(nsDialer)
	ready := make(chan error)
	go func() {
		// The thread stays in ns and ends with the goroutine.
		runtime.LockOSThread()
		ready <- unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET)
		for reply := range d {
			c, err := net.Dial("tcp4", addr)
			if err != nil {
				c = nil
			}
			reply <- c
		}
	}()
	if err := <-ready; err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { close(d) })
	return d
}

func (d nsDialer) dial(b *testing.B) net.Conn {
	reply := make(chan net.Conn)
	d <- reply
	c := <-reply
	if c == nil {
		b.Fatal("dial failed")
	}
	return c
}

func hostDialer(b *testing.B) nsDialer {
	ns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ns.Close() })
	return newNSDialer(b, ns, apiAddr+":8080")
}

func proxyDialer(b *testing.B) nsDialer {
	e := newEnv(b, `{"allow":["api.test:8080"]}`, nil)
	e.p.cfg.Log = e.p.cfg.Log.Level(1) // info: no line per connection
	if _, addrs := e.lookup(b, "api.test"); len(addrs) == 0 {
		b.Fatal("no DNS answer")
	}
	return newNSDialer(b, e.ns, apiAddr+":8080")
}

const smallRequest = "GET / HTTP/1.1\r\nHost: api.test:8080\r\nConnection: close\r\n\r\n"

func benchRequests(b *testing.B, d nsDialer) {
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		c := d.dial(b)
		if _, err := io.WriteString(c, smallRequest); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.Close()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func benchBulk(b *testing.B, d nsDialer) {
	b.SetBytes(bulkSize)
	for i := 0; i < b.N; i++ {
		c := d.dial(b)
		if _, err := io.WriteString(c, "GET /bulk HTTP/1.1\r\nHost: api.test:8080\r\nConnection: close\r\n\r\n"); err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		if n < bulkSize {
			b.Fatalf("got %d bytes", n)
		}
	}
}
