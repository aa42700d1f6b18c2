package bwrap

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/sandboxagent/agenttest"
)

// reportP50 runs fn b.N times and reports the median latency, which the
// bwrap exec goal (warm exec <= 1.3x a bare bwrap spawn) is stated in.
func reportP50(b *testing.B, fn func()) {
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		fn()
		d = append(d, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-µs")
}

// BenchmarkExecTrue is a warm exec of `true` through the backend.
func BenchmarkExecTrue(b *testing.B) {
	for _, network := range []backends.NetworkMode{backends.NetworkOff, backends.NetworkOn} {
		b.Run("network="+string(network), func(b *testing.B) {
			be, info := benchSession(b, network)
			reportP50(b, func() {
				st, err := be.Exec(context.Background(), info, backends.ExecRequest{Cmd: "true", Timeout: time.Minute})
				if err != nil || st.ExitCode != 0 {
					b.Fatalf("exec: %v %+v", err, st)
				}
			})
		})
	}
}

// BenchmarkBareBwrap spawns bwrap directly with the options the backend
// would use for the same session, without cgroups or bookkeeping: the
// floor the backend is measured against.
func BenchmarkBareBwrap(b *testing.B) {
	be, info := benchSession(b, backends.NetworkOff)
	dir, _ := be.sessionDir(info)
	l, err := be.layoutFor(be.files(info.BackendSessionID), dir, info, "", nil)
	if err != nil {
		b.Fatal(err)
	}
	reportP50(b, func() {
		fds := &fdList{next: be.fdBase()}
		defer fds.close()
		args, err := bwrapArgs(l, fds)
		if err != nil {
			b.Fatal(err)
		}
		f, err := argsFile(args)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		cmd := be.bwrapCmd(context.Background(), f, fds, []string{"/bin/sh", "-lc", "true"})
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("bwrap: %v: %s", err, out)
		}
	})
}

func benchSession(b *testing.B, network backends.NetworkMode) (*Backend, backends.Session) {
	be, err := New(Config{InstanceID: "bench-" + string(network), StateDir: b.TempDir(), AgentBinary: agenttest.Binary(b)})
	if err != nil {
		b.Fatal(err)
	}
	if err := be.Probe(context.Background()); err != nil {
		b.Fatal(err)
	}
	spec := backends.DefaultSandboxSpec()
	spec.SessionID = "bench"
	spec.Network = network
	info, err := be.StartSession(context.Background(), spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = be.StopSession(context.Background(), info)
		_ = be.Close()
	})
	return be, info
}

// BenchmarkClaim is the backend's part of handing a pooled sandbox to a
// new session: session.json rewritten with the new owner.
func BenchmarkClaim(b *testing.B) {
	be, info := benchSession(b, backends.NetworkOff)
	spec := backends.DefaultSandboxSpec()
	spec.SessionID = "claimed"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := be.Claim(context.Background(), info, spec); err != nil {
			b.Fatal(err)
		}
	}
}
