package actions

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// fullProbe is a backend that attests everything.
func fullProbe() backends.StrictReadiness {
	return backends.StrictReadiness{Available: true, CgroupV2: true, CgroupVersion: "cgroup v2",
		CgroupLimits: []string{"memory", "pids", "cpus"}, CgroupLimitsEnforced: true,
		NamespaceIsolation: true, MountIsolation: true, NetworkIsolation: true, HardWorkspaceQuota: true,
		HardSkillStorageQuota: true, BoundedEphemeralStorage: true, InodeQuota: true}
}

func TestComposeReadiness(t *testing.T) {
	storageless := fullProbe()
	storageless.HardWorkspaceQuota, storageless.HardSkillStorageQuota, storageless.BoundedEphemeralStorage, storageless.InodeQuota = false, false, false, false
	v1 := fullProbe()
	v1.CgroupV2, v1.CgroupVersion = false, "cgroup v1"
	noCgroups := fullProbe()
	noCgroups.CgroupLimitsEnforced = false
	shared := fullProbe()
	shared.NetworkIsolation, shared.Error = false, "network namespace is boxrt's"
	policy := defaultAdmissionPolicy()
	wide := policy
	wide.MaxSessions, wide.MaxManagedProcesses = 2, 1
	cases := []struct {
		name   string
		in     readinessInput
		failed []string
		error  string
	}{
		{name: "everything attested", in: readinessInput{policy: policy, backend: "bwrap", probe: fullProbe()}},
		{name: "cgroup v1 with enforced limits", in: readinessInput{policy: policy, backend: "bwrap", probe: v1}},
		{name: "no cgroup limits", in: readinessInput{policy: policy, backend: "bwrap", probe: noCgroups}, failed: []string{"cgroup_v2"}},
		{name: "storage not attested", in: readinessInput{policy: policy, backend: "bwrap", probe: storageless},
			failed: []string{"hard_workspace_quota", "hard_skill_storage_quota", "bounded_ephemeral_storage", "inode_quota"}},
		{name: "unsafe env relaxes storage only", in: readinessInput{policy: policy, backend: "bwrap", probe: storageless, unsafeStorage: true}},
		{name: "unsafe env does not relax isolation", in: readinessInput{policy: policy, backend: "bwrap", probe: shared, unsafeStorage: true},
			failed: []string{"network_isolation"}, error: "network namespace is boxrt's"},
		{name: "another backend", in: readinessInput{policy: policy, backend: "docker", probe: backends.StrictReadiness{Available: true}},
			failed: []string{"required_backend", "cgroup_v2", "namespace_isolation", "mount_isolation", "network_isolation",
				"hard_workspace_quota", "hard_skill_storage_quota", "bounded_ephemeral_storage", "inode_quota"}},
		{name: "no backend", in: readinessInput{policy: policy, probe: backends.StrictReadiness{}},
			failed: []string{"required_backend", "backend_available", "cgroup_v2", "namespace_isolation", "mount_isolation", "network_isolation",
				"hard_workspace_quota", "hard_skill_storage_quota", "bounded_ephemeral_storage", "inode_quota"}},
		{name: "configuration error", in: readinessInput{policy: policy, configErr: "bad", backend: "bwrap", probe: fullProbe()},
			failed: []string{"configuration"}, error: "Invalid sandbox admission configuration: bad"},
		{name: "workspace root", in: readinessInput{policy: policy, backend: "bwrap", workspaceErr: errors.New("no root"), probe: backends.StrictReadiness{Available: true}},
			failed: []string{"workspace_mount", "cgroup_v2", "namespace_isolation", "mount_isolation", "network_isolation",
				"hard_workspace_quota", "hard_skill_storage_quota", "bounded_ephemeral_storage", "inode_quota"}, error: "no root"},
		{name: "policy caps", in: readinessInput{policy: wide, backend: "bwrap", probe: fullProbe()}, failed: []string{"session_cap", "managed_process_cap"}},
	}
	// Each storage capability alone keeps the runtime from being ready.
	for name, drop := range map[string]func(*backends.StrictReadiness){
		"hard_workspace_quota":      func(p *backends.StrictReadiness) { p.HardWorkspaceQuota = false },
		"hard_skill_storage_quota":  func(p *backends.StrictReadiness) { p.HardSkillStorageQuota = false },
		"bounded_ephemeral_storage": func(p *backends.StrictReadiness) { p.BoundedEphemeralStorage = false },
		"inode_quota":               func(p *backends.StrictReadiness) { p.InodeQuota = false },
	} {
		probe := fullProbe()
		drop(&probe)
		cases = append(cases, struct {
			name   string
			in     readinessInput
			failed []string
			error  string
		}{name: "no " + name, in: readinessInput{policy: policy, backend: "bwrap", probe: probe}, failed: []string{name}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := composeReadiness(c.in)
			assert.Equal(t, c.failed, r.Checks.failed())
			assert.Equal(t, len(c.failed) == 0, r.Ready)
			assert.Equal(t, c.error, r.Error)
			assert.Equal(t, c.in.unsafeStorage, r.UnsafeSoftStorageLimits)
			if len(c.failed) > 0 {
				err := r.errNotReady()
				assert.ErrorIs(t, err, boxerr.ErrReadiness)
				assert.EqualError(t, err, "Managed sandbox isolation is not ready (failed checks: "+strings.Join(c.failed, ", ")+")")
			}
		})
	}
}

func TestReadinessShape(t *testing.T) {
	r := composeReadiness(readinessInput{policy: defaultAdmissionPolicy(), backend: "bwrap", probe: fullProbe()})
	raw, err := json.Marshal(r)
	require.NoError(t, err)
	var obj map[string]any
	require.NoError(t, json.Unmarshal(raw, &obj))
	assert.Equal(t, true, obj["ready"])
	assert.Equal(t, "grant_enforced", obj["mode"])
	assert.Equal(t, false, obj["unsafe_soft_storage_limits"])
	assert.NotContains(t, obj, "error")
	backend := obj["backend"].(map[string]any)
	assert.Equal(t, "nsjail", backend["name"], "bwrap stands in for the reference's nsjail")
	assert.Equal(t, "bwrap", backend["runtime_backend"])
	assert.Equal(t, true, backend["available"])
	assert.Contains(t, backend, "details")
	checks := obj["checks"].(map[string]any)
	assert.Len(t, checks, 14)
	// The checks keep the reference's order on the wire.
	assert.Contains(t, string(raw), `"checks":{"configuration":true,"required_backend":true,"workspace_mount":true,"backend_available":true,"cgroup_v2":true,"namespace_isolation":true,"mount_isolation":true,"network_isolation":true,"hard_workspace_quota":true,"hard_skill_storage_quota":true,"bounded_ephemeral_storage":true,"inode_quota":true,"session_cap":true,"managed_process_cap":true}`)
}
