package backends

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// StrictReadiness is what a backend attests about itself for LangBot's
// grant-enforced ("managed sandbox") mode, the reference's strict
// readiness dict: the three isolation facts are measured in a real
// sandbox (ProbeStrictIsolation), the rest are what the backend really
// enforces on this machine. A fact the backend cannot vouch for is false.
type StrictReadiness struct {
	Available bool `json:"available"`
	// CgroupV2 is the kernel fact: the unified hierarchy drives the limits.
	CgroupV2 bool `json:"cgroup_v2"`
	// CgroupVersion names the cgroup interface the backend drives ("cgroup
	// v1", "cgroup v2", "no cgroups"); CgroupLimits the limits it enforces
	// through it ("memory", "pids", "cpus").
	CgroupVersion string   `json:"cgroup_version"`
	CgroupLimits  []string `json:"cgroup_limits"`
	// CgroupLimitsEnforced: memory, pids and cpus are all enforced through
	// cgroups, which is what the reference's cgroup_v2 check stands for
	// (its nsjail caps memory only through cgroup v2).
	CgroupLimitsEnforced    bool   `json:"cgroup_limits_enforced"`
	NamespaceIsolation      bool   `json:"namespace_isolation"`
	MountIsolation          bool   `json:"mount_isolation"`
	NetworkIsolation        bool   `json:"network_isolation"`
	HardWorkspaceQuota      bool   `json:"hard_workspace_quota"`
	HardSkillStorageQuota   bool   `json:"hard_skill_storage_quota"`
	BoundedEphemeralStorage bool   `json:"bounded_ephemeral_storage"`
	InodeQuota              bool   `json:"inode_quota"`
	Error                   string `json:"error,omitempty"`
}

// strictMarker is what the probe writes through the sandbox's /workspace.
const strictMarker = "readiness"

// IsolationResult is what ProbeStrictIsolation measured.
type IsolationResult struct {
	// Namespace: a sandbox started and ran a command.
	Namespace bool
	// Mount: what the command wrote to /workspace reached the host
	// directory bound there.
	Mount bool
	// Network: the command's network namespace is not boxrt's.
	Network bool
}

// ProbeStrictIsolation is the reference's strict readiness probe: it
// starts a throw-away sandbox of b that mounts a fresh directory under
// workspace (the managed workspace root) read-write at /workspace, network
// off, runs `printf readiness > /workspace/.mounted && readlink
// /proc/self/ns/net`, and compares: the marker must reach the host, the
// network namespace must differ from boxrt's own. The sandbox and the
// directory are removed again. err says why a fact could not be measured.
func ProbeStrictIsolation(ctx context.Context, b Backend, workspace string) (IsolationResult, error) {
	var res IsolationResult
	dir, err := os.MkdirTemp(workspace, ".box-readiness-")
	if err != nil {
		return res, fmt.Errorf("creating the probe directory: %w", err)
	}
	defer os.RemoveAll(dir)
	spec := DefaultSandboxSpec()
	spec.SessionID = "boxrt-readiness-probe-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	spec.Image = b.DefaultImage()
	spec.HostPath, spec.HostPathMode, spec.MountPath = dir, MountRW, DefaultMountPath
	sess, err := b.StartSession(ctx, spec)
	if err != nil {
		return res, fmt.Errorf("starting the probe sandbox: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = b.StopSession(sctx, sess)
	}()
	var out, errOut bytes.Buffer
	st, err := b.Exec(ctx, sess, ExecRequest{Cmd: "printf " + strictMarker + " > /workspace/.mounted && readlink /proc/self/ns/net",
		Workdir: DefaultMountPath, Timeout: 30 * time.Second, Stdout: &out, Stderr: &errOut})
	if err == nil && (st.TimedOut || st.ExitCode != 0) {
		err = fmt.Errorf("probe exited %d (timed out: %v): %s", st.ExitCode, st.TimedOut, strings.TrimSpace(errOut.String()))
	}
	if err != nil {
		return res, fmt.Errorf("running the probe: %w", err)
	}
	res.Namespace = true
	marker, _ := os.ReadFile(filepath.Join(dir, ".mounted"))
	res.Mount = string(marker) == strictMarker
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return res, fmt.Errorf("reading boxrt's network namespace: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	inside := strings.TrimSpace(lines[len(lines)-1])
	res.Network = inside != "" && inside != own
	return res, nil
}
