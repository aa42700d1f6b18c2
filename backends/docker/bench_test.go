package docker_test

import (
	"context"
	"testing"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
)

// BenchmarkWarmExec: back-to-back `true` in one warm session, through the
// session agent and through Engine execs (each starting the next, see
// prestart.go). Compare with the docker CLI:
// `time (for i in $(seq 100); do docker exec C true; done)`.
func BenchmarkWarmExec(b *testing.B) {
	for _, tc := range []struct {
		name   string
		config func(*docker.Config)
	}{
		{"agent", func(*docker.Config) {}},
		{"engine-exec", engineExecs},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if setupErr != nil {
				b.Fatal(setupErr)
			}
			cfg := testConfig(b, instanceID())
			tc.config(&cfg)
			be, err := docker.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			ctx := context.Background()
			spec := backends.DefaultSandboxSpec()
			spec.SessionID, spec.Image = "bench/"+tc.name, testImage
			info, err := be.StartSession(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = be.StopSession(ctx, info) }()
			exec := func() {
				st, err := be.Exec(ctx, info, backends.ExecRequest{Cmd: "true"})
				if err != nil || st.ExitCode != 0 {
					b.Fatalf("exec: %+v %v", st, err)
				}
			}
			exec() // warm
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				exec()
			}
		})
	}
}
