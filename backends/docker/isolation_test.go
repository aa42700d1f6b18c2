package docker_test

import (
	"context"
	"strings"
	"testing"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// TestIsolationGVisorPerSession: with docker.gvisor_runtime set, a spec
// asking for isolation "gvisor" runs under runsc while the others keep
// the engine's default runtime, and the measured isolation tells them
// apart (own kernel vs the host's). Needs dockerd with runsc registered
// (scripts/setup), so it runs on the dockerd entries of the matrix.
func TestIsolationGVisorPerSession(t *testing.T) {
	if onPodman(t) {
		t.Skip("!!! SKIPPED on Podman: its Docker API ignores a container's runtime (TestProbeRuntimes checks boxrt refuses) !!!")
	}
	b := newBackend(t, func(c *docker.Config) { c.Runtime = ""; c.GVisorRuntime = "runsc" })
	if err := b.Probe(context.Background()); err != nil {
		t.Fatalf("Probe (is runsc registered? run scripts/setup): %v", err)
	}
	if d := b.Describe(); len(d.IsolationLevels) != 1 || d.IsolationLevels[0] != backends.IsolationGVisor {
		t.Fatalf("IsolationLevels %v", d.IsolationLevels)
	}
	reports := b.MeasureIsolation(context.Background())
	if len(reports) != 2 {
		t.Fatalf("reports %+v", reports)
	}
	for _, r := range reports {
		t.Logf("%q: %s", r.Level, r.Summary())
		if r.Error != "" {
			t.Fatalf("level %q not measured: %s", r.Level, r.Error)
		}
		if gvisor := r.Level == backends.IsolationGVisor; r.KernelShared == gvisor {
			t.Errorf("level %q: kernel shared %v", r.Level, r.KernelShared)
		}
		if r.Capabilities != 0 || !r.ReadOnlyRoot || len(r.NetworkInterfaces) != 0 {
			t.Errorf("level %q: hardening missing: %+v", r.Level, r)
		}
	}
	info := startSession(t, b, func(s *backends.SandboxSpec) { s.Isolation = backends.IsolationGVisor })
	c, err := rawClient(t).ContainerInspect(context.Background(), info.BackendSessionID)
	if err != nil {
		t.Fatal(err)
	}
	if c.HostConfig.Runtime != "runsc" {
		t.Errorf("gvisor session runs under %q", c.HostConfig.Runtime)
	}
	if got := mustRun(t, b, info, "echo hi"); got != "hi\n" {
		t.Errorf("exec on gVisor: %q", got)
	}
	// Re-adoption rebuilds the level from the label.
	restarted, err := docker.New(testConfig(t, instanceOf(t, info)))
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
	adopted, err := restarted.Adopt(context.Background())
	if err != nil || len(adopted) != 1 || adopted[0].Isolation != backends.IsolationGVisor {
		t.Fatalf("Adopt: %+v %v", adopted, err)
	}
}

// TestProbeRuntimes: a configured runtime the engine cannot honour makes
// the backend unavailable, naming the setting, instead of running sessions
// under another runtime: one dockerd does not have, or any runtime on
// Podman, whose Docker API ignores a container's runtime.
func TestProbeRuntimes(t *testing.T) {
	podman := onPodman(t)
	tests := []struct {
		name    string
		cfg     func(*docker.Config)
		wantErr string // "" = available
	}{
		{"engine default", func(c *docker.Config) { c.Runtime, c.GVisorRuntime = "", "" }, ""},
		{"unknown runtime", func(c *docker.Config) { c.Runtime = "boxrt-no-such-runtime" }, "boxrt-no-such-runtime"},
		{"gvisor runtime", func(c *docker.Config) { c.Runtime, c.GVisorRuntime = "", "runsc" }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, tc.cfg)
			err := b.Probe(context.Background())
			want := tc.wantErr
			if podman && tc.name == "gvisor runtime" {
				want = "Podman"
			}
			if want == "" {
				if err != nil {
					t.Fatalf("Probe: %v", err)
				}
				return
			}
			if !isKind(err, boxerr.ErrBackendUnavailable) || !strings.Contains(err.Error(), want) {
				t.Fatalf("Probe: %v, want BoxBackendUnavailableError naming %q", err, want)
			}
		})
	}
}
