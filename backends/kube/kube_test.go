package kube_test

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// TestSessionLifecycle: create → exec → files persist between execs →
// timeout kills the command and keeps the Pod → delete leaves nothing, for
// each workspace and network shape.
func TestSessionLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name       string
		persistent bool
		network    backends.NetworkMode
		wantKinds  []string // objects the session owns while it runs
	}{
		{"emptyDir workspace, network off", false, backends.NetworkOff, []string{"pod", "networkpolicy"}},
		{"PVC workspace, network on", true, backends.NetworkOn, []string{"pod", "pvc", "pvc"}}, // the workspace's and /tmp's
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, "")
			s := spec("life-" + randomID() + strings.Repeat("x", 100)) // ids may be long
			s.Persistent = tc.persistent
			s.Network = tc.network
			began := time.Now()
			info := start(t, b, s)
			t.Logf("StartSession: %v", time.Since(began))
			if !b.Alive(context.Background(), info) {
				t.Fatal("session not alive after StartSession")
			}
			var kinds []string
			for _, o := range objects(t, b.InstanceID()) {
				kinds = append(kinds, strings.SplitN(o, "/", 2)[0])
			}
			if strings.Join(kinds, ",") != strings.Join(tc.wantKinds, ",") {
				t.Errorf("objects of the session = %v, want kinds %v", kinds, tc.wantKinds)
			}

			for _, c := range []struct {
				name, cmd, want string
				env             map[string]string
				workdir         string
				code            int
			}{
				{name: "echo", cmd: "echo hello", want: "hello"},
				{name: "exit code", cmd: "exit 7", code: 7},
				{name: "workdir default", cmd: "pwd", want: "/workspace"},
				{name: "workdir created", cmd: "pwd", workdir: "/workspace/a/b", want: "/workspace/a/b"},
				{name: "env", cmd: `printf '%s' "$GREETING"`, env: map[string]string{"GREETING": "hi there; $(id)"}, want: "hi there; $(id)"},
				{name: "non-root", cmd: "id -u", want: "1000"},
				{name: "write file", cmd: "echo kept > /workspace/f && echo tmp > /tmp/t && echo ok", want: "ok"},
				{name: "file persists", cmd: "cat /workspace/f /tmp/t", want: "kept\ntmp"},
				// Commands go through the session agent, which needs no pid
				// file; the exec path's live in /run/boxrt
				// (TestLegacyPodPidFiles), never in the user's /tmp.
				{name: "nothing of boxrt's in /tmp", cmd: "ls -A /tmp | grep -c boxrt", code: 1, want: "0"},
			} {
				r, err := run(t, b, info, backends.ExecRequest{Cmd: c.cmd, Env: c.env, Workdir: c.workdir})
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if r.ExitCode != c.code || strings.TrimSpace(r.stdout) != c.want {
					t.Errorf("%s: exit %d stdout %q stderr %q, want exit %d stdout %q", c.name, r.ExitCode, r.stdout, r.stderr, c.code, c.want)
				}
			}

			// Timeout: the command's whole tree dies, the Pod and its files stay.
			began = time.Now()
			r, err := run(t, b, info, backends.ExecRequest{Cmd: "sleep 300 & sleep 301; echo never", Timeout: 2 * time.Second})
			if err != nil || !r.TimedOut {
				t.Fatalf("timeout exec: %+v, %v", r, err)
			}
			if d := time.Since(began); d > 10*time.Second {
				t.Errorf("timed-out exec took %v", d)
			}
			if !b.Alive(context.Background(), info) {
				t.Fatal("Pod gone after a timeout")
			}
			if got := mustRun(t, b, info, "ps -o args | grep -c '^sleep 30[01]' || true"); got != "0" {
				t.Errorf("%s sleep processes survived the timeout", got)
			}
			if got := mustRun(t, b, info, "cat /workspace/f"); got != "kept" {
				t.Errorf("workspace file after timeout = %q", got)
			}

			if err := b.StopSession(context.Background(), info); err != nil {
				t.Fatalf("StopSession: %v", err)
			}
			if b.Alive(context.Background(), info) {
				t.Error("alive after StopSession")
			}
			assertNothingLeft(t, b.InstanceID())
			// The same id can be created again at once (same Pod name).
			info2 := start(t, b, s)
			if got := mustRun(t, b, info2, "cat /workspace/f 2>/dev/null || echo fresh"); got != "fresh" {
				t.Errorf("recreated session sees the old workspace: %q", got)
			}
		})
	}
}

// TestHardening checks the Pod as the kernel sees it from inside.
func TestHardening(t *testing.T) {
	b := newBackend(t, "")
	// A Service in the namespace: with service links on, every new Pod
	// would get BOXRT_LINK_PROBE_SERVICE_HOST and friends.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "boxrt-link-probe", Namespace: testNamespace},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}, Selector: map[string]string{"none": "none"}},
	}
	if _, err := admin.CoreV1().Services(testNamespace).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	info := start(t, b, spec("hard-"+randomID()))
	for _, c := range []struct{ name, cmd, want string }{
		{"no capabilities", "grep ^CapEff /proc/self/status | tr -d '\\t'", "CapEff:0000000000000000"},
		{"no new privileges", "grep ^NoNewPrivs /proc/self/status | tr -d '\\t'", "NoNewPrivs:1"},
		{"seccomp filter", "grep '^Seccomp:' /proc/self/status | tr -d '\\t'", "Seccomp:2"},
		{"read-only rootfs", "touch /etc/x 2>/dev/null && echo writable || echo read-only", "read-only"},
		{"no service account token", "ls /var/run/secrets/kubernetes.io 2>/dev/null || echo none", "none"},
		{"no service links", "env | grep -c ^BOXRT_LINK_PROBE_ || true", "0"},
		{"memory limit", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max", "67108864"},
	} {
		if got := mustRun(t, b, info, c.cmd); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestReplicaAdoption: a replica that dies (its Backend is simply dropped,
// as after kill -9) leaves its sessions running; another replica with the
// same instance id adopts them from the API server alone and uses them.
func TestReplicaAdoption(t *testing.T) {
	a := newBackend(t, "")
	s := spec("adopt-" + randomID())
	s.Persistent = true
	info := start(t, a, s)
	mustRun(t, a, info, "echo before > /workspace/state")

	b := newBackend(t, a.InstanceID())
	adopted, err := b.Adopt(context.Background())
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if len(adopted) != 1 || adopted[0].SessionID != s.SessionID || adopted[0].BackendSessionID != info.BackendSessionID {
		t.Fatalf("Adopt = %+v, want session %s", adopted, s.SessionID)
	}
	if !adopted[0].Persistent || adopted[0].MemoryMB != 64 || adopted[0].CreatedAt.IsZero() || adopted[0].LastUsedAt.IsZero() {
		t.Errorf("adopted sandbox lost its spec: %+v", adopted[0])
	}
	if got := mustRun(t, b, adopted[0], "cat /workspace/state"); got != "before" {
		t.Errorf("adopted session's workspace = %q", got)
	}
	// The exec on replica b is visible to replica a's reaper.
	if last, err := a.LastUsed(context.Background(), info); err != nil || time.Since(last) > time.Minute {
		t.Errorf("LastUsed after an exec on another replica = %v, %v", last, err)
	}
	// Another installation sees none of it.
	other := newBackend(t, "")
	if got, err := other.Adopt(context.Background()); err != nil || len(got) != 0 {
		t.Errorf("another instance adopted %v (%v)", got, err)
	}
}

// TestConcurrentCreate: replicas creating one session at once get one Pod.
func TestConcurrentCreate(t *testing.T) {
	first := newBackend(t, "")
	s := spec("race-" + randomID())
	s.Persistent = true
	const n = 3
	infos := make([]backends.Session, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		b := first
		if i > 0 {
			b = newBackend(t, first.InstanceID())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			infos[i], errs[i] = b.StartSession(ctx, s)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		if infos[i].BackendSessionID != infos[0].BackendSessionID {
			t.Errorf("replica %d got Pod %s, replica 0 %s", i, infos[i].BackendSessionID, infos[0].BackendSessionID)
		}
	}
	t.Cleanup(func() { _ = first.StopSession(context.Background(), infos[0]) })
	if got := objects(t, first.InstanceID()); len(got) != 4 {
		t.Errorf("objects after %d concurrent creates: %v, want one pod, two pvcs (workspace, /tmp), one networkpolicy", n, got)
	}
	mustRun(t, first, infos[n-1], "true")

	// A different spec under the same id is a conflict, not a second Pod.
	other := s
	other.MemoryMB = 128
	_, err := first.StartSession(context.Background(), other)
	if !errors.Is(err, boxerr.ErrSessionConflict) {
		t.Errorf("create with another spec: %v, want BoxSessionConflictError", err)
	}

	// A conflicting create leaves the winner's objects as they were: no
	// deny-all policy lands on a network-on session.
	on := spec("race-on-" + randomID())
	on.Network = backends.NetworkOn
	onInfo := start(t, first, on)
	off := on
	off.Network = backends.NetworkOff
	if _, err := first.StartSession(context.Background(), off); !errors.Is(err, boxerr.ErrSessionConflict) {
		t.Errorf("network-off create of a network-on session: %v, want BoxSessionConflictError", err)
	}
	for _, o := range objects(t, first.InstanceID()) {
		if o == "networkpolicy/"+onInfo.BackendSessionID {
			t.Errorf("the conflicting create left %s on the network-on session", o)
		}
	}
}

// TestNetworkOff: a network-off session gets a deny-all NetworkPolicy, and
// nothing outside the pod network is reachable from it. The test cluster's
// CNI (the reference bridge plugin) does NOT enforce NetworkPolicy: what
// blocks egress there is topology (no gateway, no masquerade on the pod
// bridge). The pod-to-pod check below records that honestly.
func TestNetworkOff(t *testing.T) {
	b := newBackend(t, "")
	off := spec("netoff-" + randomID())
	info := start(t, b, off)
	ctx := context.Background()
	np, err := admin.NetworkingV1().NetworkPolicies(testNamespace).Get(ctx, info.BackendSessionID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("NetworkPolicy of a network-off session: %v", err)
	}
	if len(np.Spec.PolicyTypes) != 2 || len(np.Spec.Egress) != 0 || len(np.Spec.Ingress) != 0 {
		t.Errorf("NetworkPolicy is not deny-all: %+v", np.Spec)
	}
	// nc (busybox's wget crashes resolving in a static build) must work at
	// all: a server on the Pod's own loopback answers.
	probe := func(info backends.Session, host string) string {
		t.Helper()
		r, err := run(t, b, info, backends.ExecRequest{Cmd: "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 " + host + " 8080 2>&1 | tail -1"})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(r.stdout)
	}
	mustRun(t, b, info, "mkdir -p /tmp/www && echo self > /tmp/www/index.html && httpd -p 8080 -h /tmp/www && echo started")
	if got := probe(info, "127.0.0.1"); got != "self" {
		t.Fatalf("nc to the Pod's own loopback: %q (the probe itself is broken)", got)
	}
	// Off the pod network: a documentation address and a public one.
	for _, target := range []string{"192.0.2.1", "1.1.1.1"} {
		got := probe(info, target)
		if got == "self" || !strings.Contains(got, "unreachable") && !strings.Contains(got, "timed out") {
			t.Errorf("egress to %s from a network-off session: %q, want unreachable or timed out", target, got)
		}
		t.Logf("network-off session → %s: %q", target, got)
	}
	// Pod to pod, on the bridge: an enforcing CNI would block it because
	// of the policy; measured and logged here, not asserted.
	on := spec("neton-" + randomID())
	on.Network = backends.NetworkOn
	peer := start(t, b, on)
	mustRun(t, b, peer, "mkdir -p /tmp/www && echo peer > /tmp/www/index.html && httpd -p 8080 -h /tmp/www && echo started")
	pod, err := admin.CoreV1().Pods(testNamespace).Get(ctx, peer.BackendSessionID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("network-off session → peer Pod %s on the bridge: %q (the bridge CNI does not enforce NetworkPolicy; see docs/operations.md)",
		pod.Status.PodIP, probe(info, pod.Status.PodIP))
	t.Logf("network-on session → off-cluster 192.0.2.1: %q (no route off the pod bridge on the test cluster)", probe(peer, "192.0.2.1"))
}

// TestManagedProcessMCP runs a real MCP server (the test fixture, official
// Go SDK) as a managed process in a Pod and speaks MCP to it over the exec
// stream, which is what the relay bridges.
func TestManagedProcessMCP(t *testing.T) {
	b := newBackend(t, "")
	info := start(t, b, spec("mcp-"+randomID()))
	bin := filepath.Join(t.TempDir(), "mcpserver")
	build := exec.Command("go", "build", "-o", bin, "./test/fixtures/mcpserver")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the MCP fixture: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	upload(t, info.BackendSessionID, "/workspace/mcpserver", data)
	mustRun(t, b, info, "echo from-the-pod > /tmp/marker")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := b.StartProcess(ctx, info, backends.ProcessSpec{ProcessID: "mcp", Command: "/workspace/mcpserver", Env: map[string]string{"A": "b"}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	client := mcp.NewClient(&mcp.Implementation{Name: "boxrt-test", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.IOTransport{Reader: readCloser{p.Stdout()}, Writer: p.Stdin()}, nil)
	if err != nil {
		t.Fatalf("MCP initialize over the exec stream: %v", err)
	}
	sum, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "add", Arguments: map[string]any{"a": 40, "b": 2}})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustJSON(t, sum.StructuredContent); got != `{"sum":42}` {
		t.Errorf("add = %s", got)
	}
	read, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "/tmp/marker"}})
	if err != nil || read.IsError {
		t.Fatalf("read_file: %v %v", err, read)
	}
	if got := mustJSON(t, read.StructuredContent); !strings.Contains(got, "from-the-pod") {
		t.Errorf("read_file = %s", got)
	}
	// Signal reaches the process through a second exec; Wait reports it.
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	code, err := p.Wait()
	if err != nil || code != -int(syscall.SIGTERM) {
		t.Errorf("Wait after SIGTERM = %d, %v; want %d", code, err, -int(syscall.SIGTERM))
	}
	_ = cs.Close()
	if got := mustRun(t, b, info, "ps -o args | grep -c '^/workspace/mcpserver' || true"); got != "0" {
		t.Errorf("%s MCP server processes left", got)
	}
}

// TestUnavailable: a bad kubeconfig, an unreachable API server and an
// identity without the needed RBAC are typed BoxBackendUnavailableErrors
// naming what is wrong.
func TestUnavailable(t *testing.T) {
	needCluster(t)
	dir := t.TempDir()
	unreachable := filepath.Join(dir, "unreachable")
	writeKubeconfig(t, unreachable, "https://127.0.0.1:1", "")
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("this: [is not a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	limited := filepath.Join(dir, "limited")
	writeKubeconfig(t, limited, adminRC.Host, limitedToken(t))

	for _, tc := range []struct {
		name, kubeconfig string
		want             []string
	}{
		{"missing file", filepath.Join(dir, "nope"), []string{"cannot load the cluster configuration", "nope"}},
		{"not a kubeconfig", garbage, []string{"cannot load the cluster configuration"}},
		{"API server unreachable", unreachable, []string{"not reachable", "127.0.0.1:1"}},
		{"missing RBAC", limited, []string{"missing RBAC permission", "create pods", "create pods/exec", "create networking.k8s.io/networkpolicies"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := newBackendAt(tc.kubeconfig)
			if err != nil {
				t.Fatalf("New: %v (a bad kubeconfig must not keep boxrt from starting)", err)
			}
			err = b.Probe(context.Background())
			if !errors.Is(err, boxerr.ErrBackendUnavailable) {
				t.Fatalf("Probe = %v, want BoxBackendUnavailableError", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Probe error %q does not mention %q", err, w)
				}
			}
			_, err = b.StartSession(context.Background(), spec("unavail-"+randomID()))
			if !errors.Is(err, boxerr.ErrBackendUnavailable) {
				t.Errorf("StartSession = %v, want BoxBackendUnavailableError", err)
			}
		})
	}
}

// TestMinimalRoleSuffices binds a fresh ServiceAccount to exactly the Role
// MinimalRole prints (what boxrt doctor tells operators to apply) and runs
// a whole session lifecycle with it.
func TestMinimalRoleSuffices(t *testing.T) {
	needCluster(t)
	sa := "boxrt-minimal-" + randomID()
	applyMinimalRole(t, sa)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	writeKubeconfig(t, path, adminRC.Host, saToken(t, sa))
	b, err := newBackendAt(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { assertNothingLeft(t, b.InstanceID()) })
	if err := b.Probe(context.Background()); err != nil {
		t.Fatalf("Probe with the minimal Role: %v", err)
	}
	s := spec("minimal-" + randomID())
	s.Persistent = true // PVC and NetworkPolicy too
	info := start(t, b, s)
	if got := mustRun(t, b, info, "echo ok"); got != "ok" {
		t.Errorf("exec = %q", got)
	}
	r, err := run(t, b, info, backends.ExecRequest{Cmd: "sleep 60", Timeout: time.Second})
	if err != nil || !r.TimedOut {
		t.Errorf("timeout with the minimal Role: %+v %v", r, err)
	}
	if err := b.Suspend(context.Background(), info); err != nil {
		t.Errorf("Suspend with the minimal Role: %v", err)
	}
	if _, err := b.Adopt(context.Background()); err != nil {
		t.Errorf("Adopt with the minimal Role: %v", err)
	}
	if err := b.Resume(context.Background(), info); err != nil {
		t.Errorf("Resume with the minimal Role: %v", err)
	}
	if err := b.StopSession(context.Background(), info); err != nil {
		t.Errorf("StopSession with the minimal Role: %v", err)
	}
}

// TestRefusals: what the backend cannot do is a typed error naming the
// field, and leaves nothing behind.
func TestRefusals(t *testing.T) {
	b := newBackend(t, "")
	for _, tc := range []struct {
		name  string
		edit  func(*backends.SandboxSpec)
		kind  error
		words []string
	}{
		{"host_path", func(s *backends.SandboxSpec) { s.HostPath, s.HostPathMode = "/srv/data", backends.MountRW },
			boxerr.ErrValidation, []string{"host_path", "/srv/data", "kube.host_path_claims"}},
		{"extra mount", func(s *backends.SandboxSpec) {
			s.ExtraMounts = []backends.MountSpec{{HostPath: "/srv/x", MountPath: "/x", Mode: backends.MountRO}}
		}, boxerr.ErrValidation, []string{"extra_mounts[0].host_path"}},
		{"image not on the node", func(s *backends.SandboxSpec) { s.Image = "boxrt-no-such-image:never" },
			boxerr.ErrBox, []string{"boxrt-no-such-image:never", "ErrImageNeverPull"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec("refuse-" + randomID())
			tc.edit(&s)
			began := time.Now()
			_, err := b.StartSession(context.Background(), s)
			if !errors.Is(err, tc.kind) {
				t.Fatalf("StartSession = %v, want %v", err, tc.kind)
			}
			for _, w := range tc.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if d := time.Since(began); d > 30*time.Second {
				t.Errorf("refusal took %v", d)
			}
			assertNothingLeft(t, b.InstanceID())
		})
	}
}

// TestLegacyPodPidFiles: a Pod an earlier boxrt made (no /run/boxrt, an
// in-memory /tmp) keeps its pid files in /tmp once adopted, so that a
// timeout and a managed process's signals still reach its commands.
func TestLegacyPodPidFiles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := newBackend(t, "")
	info := start(t, a, spec("legacy-"+randomID()))
	pods := admin.CoreV1().Pods(testNamespace)
	pod, err := pods.Get(ctx, info.BackendSessionID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The same Pod as such a boxrt made it.
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Labels: pod.Labels, Annotations: pod.Annotations}, Spec: pod.Spec}
	var vols []corev1.Volume
	// Nor the session agent's volume: such a Pod runs its commands as
	// execs, which write pid files.
	for _, v := range old.Spec.Volumes {
		switch v.Name {
		case "boxrt-run", "boxrt-agent":
			continue
		case "tmp":
			v.VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}
		}
		vols = append(vols, v)
	}
	old.Spec.Volumes = vols
	c := &old.Spec.Containers[0]
	var mounts []corev1.VolumeMount
	c.Command = []string{"sh", "-c", `trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done`}
	old.Spec.RestartPolicy = corev1.RestartPolicyNever
	for _, m := range c.VolumeMounts {
		if m.Name != "boxrt-run" && m.Name != "boxrt-agent" {
			mounts = append(mounts, m)
		}
	}
	c.VolumeMounts = mounts
	grace := int64(0)
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the Pod is not gone")
		case <-time.After(200 * time.Millisecond):
		}
	}
	if _, err := pods.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for !a.Alive(ctx, info) {
		select {
		case <-ctx.Done():
			t.Fatal("the legacy Pod does not run")
		case <-time.After(200 * time.Millisecond):
		}
	}

	b := newBackend(t, a.InstanceID())
	adopted, err := b.Adopt(ctx)
	if err != nil || len(adopted) != 1 {
		t.Fatalf("Adopt = %+v, %v", adopted, err)
	}
	if got := mustRun(t, b, adopted[0], "ls -A /tmp"); !strings.HasPrefix(got, ".boxrt-exec-") {
		t.Errorf("during an exec, /tmp holds %q, want its pid file", got)
	}
	r, err := run(t, b, adopted[0], backends.ExecRequest{Cmd: "sleep 300", Timeout: 2 * time.Second})
	if err != nil || !r.TimedOut {
		t.Errorf("a timed-out exec of the legacy Pod: %+v, %v", r, err)
	}
	p, err := b.StartProcess(ctx, adopted[0], backends.ProcessSpec{ProcessID: "sleeper", Command: "sleep", Args: []string{"300"}})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, p.Stdout()) }()
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	// Signals go through the pid file, which the process writes as it starts.
	for mustRun(t, b, adopted[0], "ls -A /tmp | grep -c '^.boxrt-proc-' || true") != "1" {
		select {
		case <-ctx.Done():
			t.Fatal("no pid file of the process in /tmp")
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); err != nil || code != -int(syscall.SIGTERM) {
		t.Errorf("after SIGTERM: code %d err %v", code, err)
	}
}
