package actions

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// UnsafeSoftStorageEnv relaxes the four storage readiness checks, as in the
// reference: with it a backend that cannot bound storage hard may still
// serve grant-enforced sandboxes.
const UnsafeSoftStorageEnv = "LANGBOT_BOX_ALLOW_UNSAFE_SOFT_STORAGE_LIMITS"

// strictBackend is the boxrt backend that stands in for the reference's
// nsjail, the only backend grant-enforced mode accepts.
const strictBackend = "bwrap"

// readinessProbeTimeout bounds one strict probe (a throw-away sandbox).
const readinessProbeTimeout = 45 * time.Second

// check is one named readiness check.
type check struct {
	name string
	ok   bool
}

// readinessChecks are the 14 checks in the reference's order, which is
// also the order failed checks are named in.
type readinessChecks []check

// MarshalJSON writes the checks as one object of booleans, in order.
func (c readinessChecks) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, ch := range c {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(ch.name)
		b.Write(name)
		if ch.ok {
			b.WriteString(":true")
		} else {
			b.WriteString(":false")
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func (c readinessChecks) failed() []string {
	var out []string
	for _, ch := range c {
		if !ch.ok {
			out = append(out, ch.name)
		}
	}
	return out
}

type readinessBackend struct {
	// Name is "nsjail" when bwrap stands in for it: the host's Cloud
	// check requires that name; RuntimeBackend says what really runs.
	Name           *string                   `json:"name"`
	RuntimeBackend string                    `json:"runtime_backend,omitempty"`
	Available      bool                      `json:"available"`
	Details        *backends.StrictReadiness `json:"details,omitempty"`
}

// Readiness is the reference's readiness object of grant-enforced mode
// (box_health, box_get_backend_info's readiness, /readyz).
type Readiness struct {
	Ready                   bool             `json:"ready"`
	Mode                    string           `json:"mode"`
	Backend                 readinessBackend `json:"backend"`
	Checks                  readinessChecks  `json:"checks"`
	UnsafeSoftStorageLimits bool             `json:"unsafe_soft_storage_limits"`
	Error                   string           `json:"error,omitempty"`
}

// errNotReady is what every sandbox operation answers when r is not ready.
func (r *Readiness) errNotReady() error {
	return boxerr.Readiness("Managed sandbox isolation is not ready (failed checks: %s)", strings.Join(r.Checks.failed(), ", "))
}

// readinessInput is everything the readiness object is composed from.
type readinessInput struct {
	policy    admissionPolicy
	configErr string
	// backend is the selected backend's name ("" when none).
	backend string
	// workspaceErr: the managed workspace root is not usable.
	workspaceErr error
	probe        backends.StrictReadiness
	// unsafeStorage: UnsafeSoftStorageEnv is set.
	unsafeStorage bool
}

// composeReadiness turns what was measured into the readiness object.
// cgroup_v2 stands for what the reference's check is there for, limits
// enforced through cgroups (its nsjail has no memory cap without cgroup
// v2); boxrt's bwrap enforces them on v1 as on v2, and the kernel fact is
// in backend.details (cgroup_v2, cgroup_version).
func composeReadiness(in readinessInput) Readiness {
	p := in.probe
	storage := func(attested bool) bool { return attested || in.unsafeStorage }
	r := Readiness{
		Mode: "grant_enforced",
		Checks: readinessChecks{
			{"configuration", in.configErr == ""},
			{"required_backend", in.backend == strictBackend},
			{"workspace_mount", in.workspaceErr == nil},
			{"backend_available", p.Available},
			{"cgroup_v2", p.CgroupLimitsEnforced},
			{"namespace_isolation", p.NamespaceIsolation},
			{"mount_isolation", p.MountIsolation},
			{"network_isolation", p.NetworkIsolation},
			{"hard_workspace_quota", storage(p.HardWorkspaceQuota)},
			{"hard_skill_storage_quota", storage(p.HardSkillStorageQuota)},
			{"bounded_ephemeral_storage", storage(p.BoundedEphemeralStorage)},
			{"inode_quota", storage(p.InodeQuota)},
			{"session_cap", in.policy.MaxSessions <= 1},
			{"managed_process_cap", in.policy.MaxManagedProcesses == 0},
		},
		UnsafeSoftStorageLimits: in.unsafeStorage,
	}
	r.Ready = len(r.Checks.failed()) == 0
	details := p
	r.Backend = readinessBackend{Available: p.Available, Details: &details}
	switch {
	case in.backend == strictBackend:
		name := in.policy.RequiredBackend
		r.Backend.Name, r.Backend.RuntimeBackend = &name, in.backend
	case in.backend != "":
		name := in.backend
		r.Backend.Name = &name
	}
	switch {
	case in.configErr != "":
		r.Error = "Invalid sandbox admission configuration: " + in.configErr
	case in.workspaceErr != nil:
		r.Error = in.workspaceErr.Error()
	case p.Error != "":
		r.Error = p.Error
	}
	return r
}

// unsafeStorageAllowed reads UnsafeSoftStorageEnv as the reference does.
func unsafeStorageAllowed() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(UnsafeSoftStorageEnv))) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// managedRoot checks the managed workspace root (local.default_workspace)
// as the reference does before it serves grant-enforced sandboxes.
func managedRoot(root string) error {
	fi, err := os.Stat(root)
	switch {
	case strings.TrimSpace(root) == "" || errors.Is(err, os.ErrNotExist):
		return boxerr.Readiness("Managed sandbox admission requires box.local.default_workspace")
	case err != nil:
		return boxerr.Readiness("Managed sandbox workspace root is not usable: %v", err).Wrap(err)
	case !fi.IsDir():
		return boxerr.Readiness("Managed sandbox workspace path is not a directory")
	case unix.Access(root, unix.R_OK|unix.W_OK|unix.X_OK) != nil:
		return boxerr.Readiness("Managed sandbox workspace path is not writable")
	}
	return nil
}

// readinessCache holds the last readiness object for readiness_cache_sec;
// box_init clears it. Computing holds mu, so concurrent askers share one
// probe rather than each starting a sandbox.
type readinessCache struct {
	mu  sync.Mutex
	at  time.Time
	val *Readiness
}

func (c *readinessCache) clear() {
	c.mu.Lock()
	c.val = nil
	c.mu.Unlock()
}

// Readiness returns the readiness object of grant-enforced mode, from the
// cache when it is fresh. Call it in admission mode only.
func (t *Tenancy) Readiness(ctx context.Context) Readiness {
	g := t.grants
	g.mu.Lock()
	policy, configErr := g.policy, g.configErr
	g.mu.Unlock()
	c := &t.readiness
	c.mu.Lock()
	defer c.mu.Unlock()
	ttl := time.Duration(policy.ReadinessCacheSec) * time.Second
	if c.val != nil && time.Since(c.at) < ttl {
		return *c.val
	}
	in := readinessInput{policy: policy, configErr: configErr, unsafeStorage: unsafeStorageAllowed()}
	root := t.rt.Config().DefaultWorkspace()
	in.workspaceErr = managedRoot(root)
	if in.workspaceErr == nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readinessProbeTimeout)
		in.backend, in.probe = t.rt.StrictReadiness(pctx, root)
		cancel()
	} else if info := t.rt.BackendInfo(); info.Name != nil {
		in.backend, in.probe.Available = *info.Name, info.Available
	}
	if in.probe.CgroupLimits == nil {
		in.probe.CgroupLimits = []string{}
	}
	r := composeReadiness(in)
	if in.unsafeStorage {
		p := in.probe
		if !(p.HardWorkspaceQuota && p.HardSkillStorageQuota && p.BoundedEphemeralStorage && p.InodeQuota) {
			t.log.Warn().Str("env", UnsafeSoftStorageEnv).
				Msg("storage readiness checks relaxed: managed sandboxes run without hard storage quotas the backend cannot attest")
		}
	}
	c.val, c.at = &r, time.Now()
	return r
}

// ready refuses a sandbox operation (or relay) while managed sandbox
// isolation is not ready.
func (t *Tenancy) ready(ctx context.Context) error {
	if r := t.Readiness(ctx); !r.Ready {
		return r.errNotReady()
	}
	return nil
}

// admissionHealth answers box_health in admission mode: the readiness
// object, or the reference's BoxReadinessError when it is not ready.
func (t *Tenancy) admissionHealth(ctx context.Context) (json.RawMessage, error) {
	r := t.Readiness(ctx)
	if !r.Ready {
		return nil, boxerr.Readiness("managed sandbox isolation is not ready")
	}
	return encodeResult(r)
}

type admissionBackendInfo struct {
	Name      *string   `json:"name"`
	Available bool      `json:"available"`
	Readiness Readiness `json:"readiness"`
}

// admissionBackendInfo answers box_get_backend_info in admission mode.
func (t *Tenancy) admissionBackendInfo(ctx context.Context) (json.RawMessage, error) {
	r := t.Readiness(ctx)
	return encodeResult(admissionBackendInfo{Name: r.Backend.Name, Available: r.Ready, Readiness: r})
}
