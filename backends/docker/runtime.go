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
