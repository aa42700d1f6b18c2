package docker

import (
	"context"
	"os"
	"os/exec"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/network"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Sessions with network on share one bridge network boxrt owns, with
// inter-container communication disabled: on the engine's default bridge
// every such session reached the others' listeners (bwrap's, each in a
// namespace of its own behind slirp4netns, never could). Where boxrt is
// root next to a local engine it also closes the host's address on that
// bridge (the way bwrap's --disable-host-loopback closes the host's
// loopback) and link-local addresses, cloud metadata among them, with two
// firewall rules on the bridge's interface. The host's other addresses
// and the outside stay reachable: filtering egress is the egress proxy's
// job. Podman's Docker API ignores the ICC option (its bridge always lets
// containers talk), so on Podman sessions keep its default network.
const (
	sandboxNetwork = "boxrt-sandbox"
	sandboxBridge  = "boxrt0"
	iccOption      = "com.docker.network.bridge.enable_icc"
)

// networkMode is the NetworkMode of a session with network on ("" for
// the engine's default), the network made and fenced on first use.
func (b *Backend) networkMode(ctx context.Context) (string, error) {
	b.netMu.Lock()
	defer b.netMu.Unlock()
	if b.netReady {
		return b.netMode, nil
	}
	podman, err := b.isPodman(ctx)
	if err != nil {
		return "", err
	}
	if !podman {
		gateway, err := b.ensureNetwork(ctx)
		if err != nil {
			return "", err
		}
		if err := b.fenceHost(ctx, gateway); err != nil {
			return "", err
		}
		b.netMode = sandboxNetwork
	}
	b.netReady = true
	return b.netMode, nil
}

// ensureNetwork makes the sandbox network unless it exists (it is shared
// by every boxrt of the engine and kept), checks that it isolates its
// containers, and returns the host's address on it.
func (b *Backend) ensureNetwork(ctx context.Context) (string, error) {
	n, err := b.cli.NetworkInspect(ctx, sandboxNetwork, network.InspectOptions{})
	if cerrdefs.IsNotFound(err) {
		_, err = b.cli.NetworkCreate(ctx, sandboxNetwork, network.CreateOptions{
			Driver:  "bridge",
			Options: map[string]string{iccOption: "false", "com.docker.network.bridge.name": sandboxBridge},
			Labels:  map[string]string{LabelManaged: "true"},
		})
		if err != nil && !cerrdefs.IsConflict(err) {
			return "", b.apiError("creating network "+sandboxNetwork, err)
		}
		n, err = b.cli.NetworkInspect(ctx, sandboxNetwork, network.InspectOptions{})
	}
	if err != nil {
		return "", b.apiError("inspecting network "+sandboxNetwork, err)
	}
	if n.Driver != "bridge" || n.Options[iccOption] != "false" {
		return "", boxerr.BackendUnavailable("docker network %s exists but does not isolate its containers (driver %q, %s=%q); "+
			"remove it (docker network rm %s) and boxrt makes it again", sandboxNetwork, n.Driver, iccOption, n.Options[iccOption], sandboxNetwork)
	}
	for _, c := range n.IPAM.Config {
		if c.Gateway != "" {
			return c.Gateway, nil
		}
	}
	return "", nil
}

// fenceHost rejects what the bridge's containers send to the host's
// address on it and to link-local addresses; a rule already there is not
// added twice. It does nothing where it cannot: an engine on another
// host, boxrt not root, no iptables.
func (b *Backend) fenceHost(ctx context.Context, gateway string) error {
	ipt, err := exec.LookPath("iptables")
	if !b.localEngine() || os.Geteuid() != 0 || err != nil {
		return nil
	}
	rules := [][]string{{"DOCKER-USER", "-i", sandboxBridge, "-d", "169.254.0.0/16", "-j", "REJECT"}}
	if gateway != "" {
		// Only new connections: replies to the host's own (an engine's
		// health check, a test) must still come in.
		rules = append(rules, []string{"INPUT", "-i", sandboxBridge, "-d", gateway, "-m", "conntrack", "--ctstate", "NEW", "-j", "REJECT"})
	}
	for _, r := range rules {
		if exec.CommandContext(ctx, ipt, append([]string{"-w", "-C"}, r...)...).Run() == nil {
			continue
		}
		if err := run(ctx, ipt, append([]string{"-w", "-I"}, r...)...); err != nil {
			return boxerr.BackendUnavailable("cannot fence the host off network %s: %v", sandboxNetwork, err).Wrap(err)
		}
	}
	return nil
}
