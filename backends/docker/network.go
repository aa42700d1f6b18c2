package docker

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/atomicfile"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// A session with network (on or a policy) runs with the engine's network
// "none": a namespace with loopback only. Once its container has started,
// boxrt (root, next to a local engine) attaches its egress proxy to that
// namespace through /proc/<pid>/ns/net (internal/egress: a default route
// into loopback, nftables rules that send every TCP connection to the
// proxy and every DNS query to its resolver, the rest dropped). The
// namespace belongs to the engine, not to the container's user namespace,
// and the container has no CAP_NET_ADMIN, so it cannot undo the rules;
// programs that ignore HTTP(S)_PROXY are confined all the same. Until the
// attach there is no route out at all. A restarted container (resume,
// restart, adoption) has a new namespace and is attached again; its
// egress session ends with the container (stop, suspend, delete).
//
// gVisor's netstack does not use the namespace's routes or rules, so a
// gVisor session with network is refused rather than left unconfined.

// egressResolver is the nameserver of a container with network: any
// address that is not loopback would do.
const egressResolver = "10.0.2.3"

// egressCAFile is the CA bundle of a session with secrets, written into
// its agent directory on the host, which the container sees read-only at
// agentSockDir.
const egressCAFile = "egress-ca.pem"

// checkEgress refuses a session with network where boxrt cannot attach
// the proxy.
func (b *Backend) checkEgress(sb backends.Sandbox) error {
	if !sb.Network.Egress() {
		return nil
	}
	switch {
	case b.egress == nil:
		return boxerr.BackendUnavailable("docker: a session with network goes out through boxrt's egress proxy, and this backend has none (it is built by boxrt serve)")
	case !b.localEngine() || os.Geteuid() != 0:
		return boxerr.BackendUnavailable("docker: a session with network needs boxrt as root next to a local engine (it attaches its egress proxy to the container's network namespace); use network \"off\"")
	case b.OnGVisor(sb):
		return boxerr.Validation("network", "network other than \"off\" is not available with isolation %q: gVisor's netstack would bypass the egress proxy's rules", sb.Isolation)
	}
	return nil
}

// attachNet attaches the egress proxy to the started container of info
// (replacing an earlier attachment of the same container) and writes its
// CA bundle when it has secrets. A container without network: nothing.
func (b *Backend) attachNet(ctx context.Context, info backends.Session) error {
	if !info.Network.Egress() {
		return nil
	}
	if err := b.checkEgress(info.Sandbox); err != nil {
		return err
	}
	name := info.BackendSessionID
	c, err := b.cli.ContainerInspect(ctx, name)
	if err != nil {
		return b.apiError("inspecting container "+name, err)
	}
	if c.State == nil || c.State.Pid <= 0 {
		return boxerr.Failure("docker backend: container %s has no process to attach the network to", name)
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", c.State.Pid))
	if err != nil {
		return boxerr.Failure("docker backend: opening the network namespace of %s: %v", name, err).Wrap(err)
	}
	defer ns.Close()
	pol, err := info.Network.Policy("network")
	if err != nil {
		return err
	}
	b.egMu.Lock()
	defer b.egMu.Unlock()
	if old := b.egSessions[name]; old != nil {
		old.Close()
		delete(b.egSessions, name)
	}
	es, err := b.egress.Attach(egress.Attachment{ID: info.SessionID, NetNS: ns, Policy: pol, Secrets: b.egSecrets[name]})
	if err != nil {
		return err
	}
	if err := b.writeCA(name, es); err != nil {
		es.Close()
		return err
	}
	b.egSessions[name] = es
	return nil
}

// writeCA puts the session CA's bundle where the container reads it.
func (b *Backend) writeCA(name string, es *egress.Session) error {
	bundle, err := es.CABundle()
	if err != nil || bundle == nil {
		return err
	}
	if _, err := os.Stat(b.agentDir(name)); err != nil {
		// Engine execs (no agent): nothing of boxrt's is bound into the
		// container to carry the bundle.
		return boxerr.BackendUnavailable("docker: secrets need the session agent, whose directory carries the CA bundle into the container (this session runs without it)")
	}
	if err := atomicfile.Write(filepath.Join(b.agentDir(name), egressCAFile), bundle, 0o644); err != nil {
		return boxerr.Failure("docker backend: writing the egress CA of %s: %v", name, err).Wrap(err)
	}
	return nil
}

// detachNet ends the container's egress session (its namespace goes with
// the container).
func (b *Backend) detachNet(name string) {
	b.egMu.Lock()
	defer b.egMu.Unlock()
	if es := b.egSessions[name]; es != nil {
		es.Close()
		delete(b.egSessions, name)
	}
}

// forgetNet is detachNet for a session that ends: its secrets go too.
func (b *Backend) forgetNet(name string) {
	b.detachNet(name)
	b.egMu.Lock()
	delete(b.egSecrets, name)
	b.egMu.Unlock()
}

// execEnv is env over what the container's egress session gives every
// command: each secret's placeholder and, with secrets, the variables
// naming the CA bundle.
func (b *Backend) execEnv(name string, env map[string]string) map[string]string {
	b.egMu.Lock()
	es := b.egSessions[name]
	b.egMu.Unlock()
	if es == nil {
		return env
	}
	out := es.Env()
	if es.CAPEM() != nil {
		maps.Copy(out, egress.TrustEnv(agentSockDir+"/"+egressCAFile))
	}
	maps.Copy(out, env)
	return out
}
