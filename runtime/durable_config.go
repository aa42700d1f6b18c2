package runtime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Durable configures suspension, snapshots and warm pools (the "durable"
// section).
type Durable struct {
	// IdlePolicy is what the reaper does with an idle session: IdleAuto
	// (default), IdleSuspend or IdleDestroy.
	IdlePolicy string `json:"idle_policy"`
	// SnapshotDir is the local snapshot store; "" is <state dir>/snapshots.
	SnapshotDir string `json:"snapshot_dir"`
	// SnapshotMaxTotalMB bounds the store's total size (compressed).
	SnapshotMaxTotalMB int `json:"snapshot_max_total_mb"`
	// SnapshotHostPaths lets a snapshot copy a host_path workspace. Off by
	// default: the host's files stay the host's (extra mounts and skills
	// are never copied).
	SnapshotHostPaths bool `json:"snapshot_host_paths"`
	// Pools are warm pools of ready sandboxes (pool.go).
	Pools []PoolConfig `json:"pools"`
}

// PoolConfig is one warm pool: Size sandboxes of one kind kept started, so
// that a new session asking for exactly that kind (no host_path, extra
// mounts, skills or snapshot) gets one at once.
type PoolConfig struct {
	// Name identifies the pool (1-32 of [a-z0-9-]).
	Name string `json:"name"`
	// Backend limits the pool to one backend ("" = the selected one).
	Backend string `json:"backend"`
	// Size is how many ready sandboxes the pool keeps (0-64).
	Size int `json:"size"`
	// RefillIntervalMS is the least time between two refills after a
	// sandbox was taken (default 0: refill at once). The first fill does
	// not wait.
	RefillIntervalMS int `json:"refill_interval_ms"`
	// Sandbox is the sandbox kind: the session fields image, network,
	// mount_path, cpus, memory_mb, pids_limit, read_only_rootfs,
	// workspace_quota_mb; omitted ones take the session defaults.
	Sandbox json.RawMessage `json:"sandbox"`
}

var poolNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// poolBackends are the backends with warm pools (backends.Pooler).
var poolBackends = []string{"docker", "bwrap", "kube"}

// sandbox decodes the pool's sandbox kind over the session defaults.
func (p PoolConfig) sandbox() (backends.Sandbox, error) {
	sb := backends.DefaultSandboxSpec().Sandbox
	if len(p.Sandbox) > 0 && string(p.Sandbox) != "null" {
		dec := json.NewDecoder(bytes.NewReader(p.Sandbox))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&sb); err != nil {
			return sb, err
		}
	}
	if sb.HostPath != "" || len(sb.ExtraMounts) > 0 {
		return sb, fmt.Errorf("pooled sandboxes take no host_path or extra_mounts")
	}
	sb.HostPathMode = backends.MountRW
	return sb, nil
}

// Durable defaults and bounds.
const (
	maxPoolSize               = 64
	DefaultSnapshotMaxTotalMB = 10 << 10
	maxSnapshotMaxTotalMB     = 1 << 24
)

func defaultDurable() Durable {
	return Durable{IdlePolicy: IdleAuto, SnapshotMaxTotalMB: DefaultSnapshotMaxTotalMB}
}

func (d *Durable) validate() error {
	switch d.IdlePolicy {
	case IdleAuto, IdleSuspend, IdleDestroy:
	default:
		return boxerr.Validation("durable.idle_policy", "durable.idle_policy must be %q, %q or %q, got %q",
			IdleAuto, IdleSuspend, IdleDestroy, d.IdlePolicy)
	}
	if d.SnapshotMaxTotalMB < 1 || d.SnapshotMaxTotalMB > maxSnapshotMaxTotalMB {
		return boxerr.Validation("durable.snapshot_max_total_mb", "durable.snapshot_max_total_mb must be between 1 and %d, got %d",
			maxSnapshotMaxTotalMB, d.SnapshotMaxTotalMB)
	}
	seen := map[string]bool{}
	for i, p := range d.Pools {
		field := fmt.Sprintf("durable.pools[%d]", i)
		switch {
		case !poolNameRe.MatchString(p.Name) || seen[p.Name]:
			return boxerr.Validation(field+".name", "%s.name must be 1-32 of [a-z0-9-], unique, got %q", field, p.Name)
		case p.Backend != "" && !slices.Contains(poolBackends, p.Backend):
			return boxerr.Validation(field+".backend", "%s.backend must be empty or one of %s, got %q", field, strings.Join(poolBackends, ", "), p.Backend)
		case p.Size < 0 || p.Size > maxPoolSize:
			return boxerr.Validation(field+".size", "%s.size must be between 0 and %d, got %d", field, maxPoolSize, p.Size)
		case p.RefillIntervalMS < 0 || p.RefillIntervalMS > 3600_000:
			return boxerr.Validation(field+".refill_interval_ms", "%s.refill_interval_ms must be between 0 and 3600000, got %d", field, p.RefillIntervalMS)
		}
		if _, err := p.sandbox(); err != nil {
			return boxerr.Validation(field+".sandbox", "%s.sandbox: %v", field, err)
		}
		seen[p.Name] = true
	}
	return nil
}
