package docker

import (
	"context"
	"slices"
	"sort"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

// runtimeFor is the engine runtime a session of this sandbox runs under:
// the gVisor runtime when the spec asks for gVisor (the runtime has already
// checked that the operator allowed it), the configured one otherwise ("" is
// the engine's default).
func (b *Backend) runtimeFor(sb backends.Sandbox) string {
	if sb.Isolation == backends.IsolationGVisor {
		return b.gvisorRuntime
	}
	return b.runtime
}

// isolationLevels are the levels a spec may ask for beyond the default.
func (b *Backend) isolationLevels() []string {
	if b.gvisorRuntime == "" {
		return nil
	}
	return []string{backends.IsolationGVisor}
}

// runtimeLabel names the configured runtime for people: "runc" when the
// engine's default is used (what Docker and Podman default to here).
func (b *Backend) runtimeLabel() string {
	if b.runtime == "" {
		return "engine default runtime"
	}
	return b.runtime
}

// checkRuntimes makes sure every runtime boxrt was configured with is
// registered with the engine, once: a missing one would otherwise surface
// as an engine error at the first session create, naming no setting.
func (b *Backend) checkRuntimes(ctx context.Context) error {
	var want []string
	for _, r := range []string{b.runtime, b.gvisorRuntime} {
		if r != "" && !slices.Contains(want, r) {
			want = append(want, r)
		}
	}
	if len(want) == 0 {
		return nil
	}
	b.runtimesMu.Lock()
	defer b.runtimesMu.Unlock()
	if b.runtimesOK {
		return nil
	}
	info, err := b.cli.Info(ctx)
	if err != nil {
		return b.apiError("reading the engine's runtimes", err)
	}
	have := make([]string, 0, len(info.Runtimes))
	for name := range info.Runtimes {
		have = append(have, name)
	}
	sort.Strings(have)
	for _, r := range want {
		if !slices.Contains(have, r) {
			return boxerr.BackendUnavailable("Docker engine at %s has no runtime %q (it has: %s); register it in /etc/docker/daemon.json "+
				"(scripts/setup does for runsc) and reload dockerd, or change docker.runtime / docker.gvisor_runtime",
				b.cli.DaemonHost(), r, strings.Join(have, ", "))
		}
	}
	b.runtimesOK = true
	return nil
}

// isGVisor tells whether an engine runtime name is gVisor's: the one the
// operator configured for isolation "gvisor", or one named runsc*.
func (b *Backend) isGVisor(rt string) bool {
	return rt != "" && (rt == b.gvisorRuntime || strings.HasPrefix(rt, "runsc"))
}

// gVisor runs every sandboxed task on host threads of its own, all in the
// container's pids cgroup: measured here (runsc 20221219, ptrace platform),
// an idle sandbox holds about 45 host pids and each sleeping process about
// 11 more. A pids_limit meant as "processes in the sandbox" therefore
// becomes a host limit of gvisorPidsBase + gvisorPidsPerTask per process;
// a fork bomb still ends at that ceiling, with the sandbox's own kernel
// failing to start more tasks instead of the host's.
const (
	gvisorPidsBase    = 64
	gvisorPidsPerTask = 16
)

// hostPidsLimit is the pids cgroup limit of a session with this runtime.
func (b *Backend) hostPidsLimit(rt string, pidsLimit int) int64 {
	if b.isGVisor(rt) {
		return int64(gvisorPidsBase + gvisorPidsPerTask*pidsLimit)
	}
	return int64(pidsLimit)
}

// MeasureIsolation measures this backend's isolation by probing a real
// sandbox of each level it offers (backends.MeasureIsolation).
func (b *Backend) MeasureIsolation(ctx context.Context) []backends.IsolationReport {
	return backends.MeasureIsolation(ctx, b)
}
