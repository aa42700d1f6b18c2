package backends

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// IsolationReport is what a sandbox of a backend (and level) looks like from
// the inside, measured by running a probe in a real sandbox: nothing in it
// is taken from a table. box_get_backend_info and `boxrt doctor` show it.
type IsolationReport struct {
	// Level is the isolation level probed ("" for the backend's default).
	Level string `json:"level"`
	// KernelShared is true when the sandbox sees the host's kernel release,
	// i.e. its syscalls reach the host kernel directly (runc, Podman,
	// bwrap); gVisor answers with its own.
	KernelShared  bool   `json:"kernel_shared"`
	KernelRelease string `json:"kernel_release"`
	// Seccomp is the Seccomp mode of a sandbox process: "filter",
	// "strict" or "disabled". gVisor's filter sits on its own host-side
	// kernel and is not visible inside (it reports disabled).
	Seccomp    string `json:"seccomp"`
	NoNewPrivs bool   `json:"no_new_privs"`
	// UserNamespace is true when the sandbox has a user namespace of its
	// own (uid_map is not the initial namespace's "0 0 4294967295"). UIDMap
	// is relative to the parent namespace: bwrap's "0 0 1" is a nested
	// namespace whose parent maps 0 to the host user boxrt-sandbox.
	UserNamespace bool   `json:"user_namespace"`
	UIDMap        string `json:"uid_map"`
	UID           int    `json:"uid"`
	// Capabilities is the number of effective capabilities of a command
	// (CapEff); CapEff the raw mask.
	Capabilities int    `json:"capabilities"`
	CapEff       string `json:"cap_eff"`
	ReadOnlyRoot bool   `json:"read_only_root"`
	// NetworkInterfaces are the interfaces other than loopback a sandbox
	// with network off sees; empty means no route out.
	NetworkInterfaces []string `json:"network_interfaces"`
	// CgroupLimits are the limits the sandbox's own cgroup files show at
	// the values the probe asked for ("memory", "pids"). A runtime that
	// enforces limits outside the sandbox's view (gVisor) shows none here
	// while Description.EnforcedLimits still lists them.
	CgroupLimits []string  `json:"cgroup_limits"`
	MeasuredAt   time.Time `json:"measured_at"`
	Error        string    `json:"error,omitempty"`
}

// Probe sandbox limits: small and distinctive, so the cgroup files showing
// exactly them means the backend applied them.
const (
	probeMemoryMB = 96
	probePids     = 77
)

// isolationScript prints key=value lines; it needs only a POSIX shell and
// busybox-level tools (cat, grep, ls), as images may have nothing more.
const isolationScript = `echo "kernel=$(uname -r)"
grep -E '^(CapEff|Seccomp|NoNewPrivs):' /proc/self/status | sed 's/:[[:space:]]*/=/'
echo "uidmap=$(head -n 1 /proc/self/uid_map | tr -s ' \t' ' ' | sed 's/^ //')"
echo "uid=$(id -u)"
if touch /.boxrt-probe 2>/dev/null; then rm -f /.boxrt-probe; echo rootro=0; else echo rootro=1; fi
echo "netifs=$(tail -n +3 /proc/net/dev 2>/dev/null | cut -d: -f1 | tr -d ' ' | grep -v '^lo$' | tr '\n' ' ')"
for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do [ -r $f ] && echo "memory=$(cat $f)" && break; done
for f in /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max; do [ -r $f ] && echo "pids=$(cat $f)" && break; done
true`

// MeasureIsolation probes b at its default isolation and at every stronger
// level it offers; backends implement the runtime's IsolationProber with it.
func MeasureIsolation(ctx context.Context, b Backend) []IsolationReport {
	levels := append([]string{IsolationDefault}, b.Describe().IsolationLevels...)
	out := make([]IsolationReport, 0, len(levels))
	for _, l := range levels {
		spec := DefaultSandboxSpec()
		spec.Isolation = l
		out = append(out, ProbeIsolation(ctx, b, spec))
	}
	return out
}

// ProbeIsolation starts a sandbox of b with base as its starting point
// (network off, a read-only root, small limits, the given isolation level),
// runs the probe in it and stops it. The report carries the error when the
// probe could not run.
func ProbeIsolation(ctx context.Context, b Backend, base SandboxSpec) IsolationReport {
	rep := IsolationReport{Level: base.Isolation, MeasuredAt: time.Now().UTC()}
	spec := base
	spec.Network = NetworkOff
	spec.ReadOnlyRootfs = true
	spec.MemoryMB = probeMemoryMB
	spec.PidsLimit = probePids
	if spec.Image == "" {
		spec.Image = b.DefaultImage()
	}
	if spec.MountPath == "" {
		spec.MountPath = DefaultMountPath
	}
	if spec.SessionID == "" {
		spec.SessionID = "boxrt-isolation-probe-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	sess, err := b.StartSession(ctx, spec)
	if err != nil {
		rep.Error = fmt.Sprintf("starting a probe sandbox: %v", err)
		return rep
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = b.StopSession(sctx, sess)
	}()
	var out, errOut bytes.Buffer
	st, err := b.Exec(ctx, sess, ExecRequest{Cmd: isolationScript, Workdir: spec.MountPath, Timeout: 30 * time.Second, Stdout: &out, Stderr: &errOut})
	if err == nil && (st.TimedOut || st.ExitCode != 0) {
		err = fmt.Errorf("probe exited %d (timed out: %v): %s", st.ExitCode, st.TimedOut, strings.TrimSpace(errOut.String()))
	}
	if err != nil {
		rep.Error = fmt.Sprintf("running the probe: %v", err)
		return rep
	}
	var host unix.Utsname
	_ = unix.Uname(&host)
	rep.parse(out.String(), unix.ByteSliceToString(host.Release[:]))
	return rep
}

// parse fills the report from the probe's output; hostRelease is the host's
// kernel release.
func (r *IsolationReport) parse(out, hostRelease string) {
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = strings.TrimSpace(v)
		}
	}
	r.KernelRelease = kv["kernel"]
	r.KernelShared = r.KernelRelease == hostRelease
	switch kv["Seccomp"] {
	case "1":
		r.Seccomp = "strict"
	case "2":
		r.Seccomp = "filter"
	default:
		r.Seccomp = "disabled"
	}
	r.NoNewPrivs = kv["NoNewPrivs"] == "1"
	r.UIDMap = kv["uidmap"]
	r.UserNamespace = r.UIDMap != "" && r.UIDMap != initialUIDMap
	r.UID, _ = strconv.Atoi(kv["uid"])
	r.CapEff = kv["CapEff"]
	if mask, err := strconv.ParseUint(r.CapEff, 16, 64); err == nil {
		r.Capabilities = bits.OnesCount64(mask)
	}
	r.ReadOnlyRoot = kv["rootro"] == "1"
	r.NetworkInterfaces = strings.Fields(kv["netifs"])
	r.CgroupLimits = []string{}
	if v, err := strconv.ParseInt(kv["memory"], 10, 64); err == nil && v == probeMemoryMB<<20 {
		r.CgroupLimits = append(r.CgroupLimits, "memory")
	}
	if kv["pids"] == strconv.Itoa(probePids) {
		r.CgroupLimits = append(r.CgroupLimits, "pids")
	}
}

// initialUIDMap is the uid_map of the initial user namespace, as the probe
// prints it (fields joined by one space).
const initialUIDMap = "0 0 4294967295"

// Summary is the report in one line, for people.
func (r IsolationReport) Summary() string {
	if r.Error != "" {
		return "not measured: " + r.Error
	}
	kernel := "host kernel shared"
	if !r.KernelShared {
		kernel = "own kernel " + r.KernelRelease + " (host's not reached directly)"
	}
	netw := "network off: only loopback"
	if len(r.NetworkInterfaces) > 0 {
		netw = "network off still shows " + strings.Join(r.NetworkInterfaces, ",")
	}
	limits := "none"
	if len(r.CgroupLimits) > 0 {
		limits = strings.Join(r.CgroupLimits, ",")
	}
	return fmt.Sprintf("%s; seccomp %s; no_new_privs %v; user namespace %v (uid %d, uid_map %q); %d capabilities; read-only root %v; %s; cgroup limits visible: %s",
		kernel, r.Seccomp, r.NoNewPrivs, r.UserNamespace, r.UID, r.UIDMap, r.Capabilities, r.ReadOnlyRoot, netw, limits)
}
