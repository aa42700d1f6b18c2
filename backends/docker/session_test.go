package docker_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestNewValidatesConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  docker.Config
		ok   bool
	}{
		{"minimal", docker.Config{InstanceID: "x"}, true},
		{"auto user", docker.Config{InstanceID: "x", User: "auto"}, true},
		{"uid:gid", docker.Config{InstanceID: "x", User: "1000:1000"}, true},
		{"no instance id", docker.Config{}, false},
		{"bad user", docker.Config{InstanceID: "x", User: "1000:1000 --privileged"}, false},
		{"negative tmp", docker.Config{InstanceID: "x", TmpSizeMB: -1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := docker.New(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New(%+v) err = %v, want ok=%v", tc.cfg, err, tc.ok)
			}
			if err != nil {
				if !isKind(err, boxerr.ErrValidation) {
					t.Errorf("error kind: %v", err)
				}
				return
			}
			if b.DefaultImage() != docker.DefaultImage || b.Name() != "docker" {
				t.Errorf("defaults: image %q name %q", b.DefaultImage(), b.Name())
			}
			_ = b.Close()
		})
	}
}

func TestDescribe(t *testing.T) {
	for _, cpu := range []bool{false, true} {
		b, err := docker.New(docker.Config{InstanceID: "x", CPULimitEnabled: cpu})
		if err != nil {
			t.Fatal(err)
		}
		d := b.Describe()
		_ = b.Close()
		want := []string{"memory", "pids"}
		if cpu {
			want = append(want, "cpus")
		}
		// Not probed yet: the engine's default runtime is not known.
		if !slices.Equal(d.EnforcedLimits, want) || d.Isolation != "container (engine default runtime)" || d.SkillsLive || len(d.IsolationLevels) != 0 {
			t.Errorf("cpu=%v: %+v", cpu, d)
		}
	}
}

func TestProbe(t *testing.T) {
	b := newBackend(t)
	if err := b.Probe(context.Background()); err != nil {
		t.Fatalf("Probe: %v", err)
	}

	t.Setenv("DOCKER_HOST", "unix:///nonexistent/boxrt-test.sock")
	bad, err := docker.New(docker.Config{InstanceID: instanceID()})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	start := time.Now()
	err = bad.Probe(context.Background())
	if !isKind(err, boxerr.ErrBackendUnavailable) {
		t.Fatalf("Probe on a missing socket: %v, want BoxBackendUnavailableError", err)
	}
	for _, hint := range []string{"docker.io", "dockerd", "DOCKER_HOST", "/nonexistent/boxrt-test.sock"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("Probe error does not mention %q: %v", hint, err)
		}
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("Probe took %v", d)
	}
}

func TestStartSessionHardening(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		cpuLimit bool
		mutate   func(*backends.SandboxSpec)
		check    func(t *testing.T, c container.InspectResponse)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, c container.InspectResponse) {
				hc := c.HostConfig
				if hc.NanoCPUs != 0 {
					t.Errorf("NanoCPUs %d with the cpu limit disabled", hc.NanoCPUs)
				}
				if string(hc.NetworkMode) != "none" {
					t.Errorf("NetworkMode %q", hc.NetworkMode)
				}
				if !hc.ReadonlyRootfs {
					t.Error("rootfs not read-only")
				}
				// /tmp is not a tmpfs: it would not survive a suspend.
				// (Podman adds /run and /var/tmp to a read-only rootfs.)
				if _, ok := hc.Tmpfs["/tmp"]; ok || hc.Tmpfs["/run/boxrt"] == "" {
					t.Errorf("Tmpfs %v, want boxrt's /run/boxrt and no /tmp", hc.Tmpfs)
				}
				if hc.Memory != 256<<20 || hc.MemorySwap != hc.Memory {
					t.Errorf("Memory %d MemorySwap %d", hc.Memory, hc.MemorySwap)
				}
				if hc.PidsLimit == nil || *hc.PidsLimit != cgroupPids(t, backends.DefaultPidsLimit) {
					t.Errorf("PidsLimit %v", hc.PidsLimit)
				}
			},
		},
		{
			name:     "cpu limit and network on",
			cpuLimit: true,
			mutate: func(s *backends.SandboxSpec) {
				s.CPUs = 0.5
				if !onGVisor(t) { // refused there (TestExecNetwork)
					s.Network = backends.NetworkOn
				}
				s.ReadOnlyRootfs = false
				s.PidsLimit = 50
			},
			check: func(t *testing.T, c container.InspectResponse) {
				hc := c.HostConfig
				if hc.NanoCPUs != 5e8 {
					t.Errorf("NanoCPUs %d", hc.NanoCPUs)
				}
				// Its only way out is the egress proxy, attached to the
				// namespace of network none.
				if !hc.NetworkMode.IsNone() {
					t.Errorf("network on: NetworkMode %q, want none", hc.NetworkMode)
				}
				if hc.ReadonlyRootfs {
					t.Error("rootfs read-only")
				}
				if *hc.PidsLimit != cgroupPids(t, 50) {
					t.Errorf("PidsLimit %d", *hc.PidsLimit)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t, func(c *docker.Config) { c.CPULimitEnabled = tc.cpuLimit })
			var mutate []func(*backends.SandboxSpec)
			if tc.mutate != nil {
				mutate = append(mutate, tc.mutate)
			}
			info := startSession(t, b, mutate...)
			if !strings.HasPrefix(info.BackendSessionID, "boxrt-t-teststartsessionhardening") || info.BackendName != "docker" {
				t.Errorf("info %+v", info)
			}
			c, err := rawClient(t).ContainerInspect(context.Background(), info.BackendSessionID)
			if err != nil {
				t.Fatal(err)
			}
			hc := c.HostConfig
			// Podman reports the dropped capabilities one by one, so what
			// counts is what a command really has.
			if !(slices.Equal(hc.CapDrop, []string{"ALL"}) || onPodman(t)) || len(hc.CapAdd) != 0 || hc.Privileged {
				t.Errorf("CapDrop %v CapAdd %v Privileged %v", hc.CapDrop, hc.CapAdd, hc.Privileged)
			}
			if got := mustRun(t, b, info, "grep CapEff /proc/self/status"); !strings.HasSuffix(strings.TrimSpace(got), "0000000000000000") {
				t.Errorf("a command has capabilities: %q", got)
			}
			if !slices.Contains(hc.SecurityOpt, "no-new-privileges") {
				t.Errorf("SecurityOpt %v", hc.SecurityOpt)
			}
			if usesAgent(t) {
				checkAgentContainer(t, c)
			} else if hc.Init == nil || !*hc.Init {
				t.Error("Init not set")
			}
			if matrixRuntime != "" && hc.Runtime != matrixRuntime {
				t.Errorf("Runtime %q, want %q", hc.Runtime, matrixRuntime)
			}
			l := c.Config.Labels
			if l[docker.LabelManaged] != "true" || l[docker.LabelSession] != info.SessionID || l[docker.LabelSpec] == "" || l[docker.LabelCreated] == "" {
				t.Errorf("labels %v", l)
			}
			tc.check(t, c)

			status := mustRun(t, b, info, "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status")
			for _, line := range strings.Split(strings.TrimSpace(status), "\n") {
				k, v, _ := strings.Cut(line, ":")
				v = strings.TrimSpace(v)
				want := "0000000000000000"
				if k == "NoNewPrivs" {
					want = "1"
				}
				if v != want {
					t.Errorf("%s = %s, want %s", k, v, want)
				}
			}
		})
	}
}

func TestStartSessionMissingImage(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	spec := testSpec(t)
	spec.Image = "boxrt-test:missing-" + strings.ReplaceAll(instanceID(), "-", "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := b.StartSession(ctx, spec)
	if err == nil {
		t.Fatal("StartSession with a missing image succeeded")
	}
	if !isKind(err, boxerr.ErrBox) {
		t.Errorf("error kind: %v", err)
	}
	for _, want := range []string{spec.Image, "docker load", "not available"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
	t.Logf("missing image error: %v", err)
}

func TestStopSessionRemovesContainerAndVolume(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	cli := rawClient(t)
	spec := testSpec(t)
	ctx := context.Background()
	info, err := b.StartSession(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, b, info, "echo x > /workspace/x")
	vol := "boxrt-ws-" + info.BackendSessionID
	if _, err := cli.VolumeInspect(ctx, vol); err != nil {
		t.Fatalf("workspace volume %s: %v", vol, err)
	}
	if !b.Alive(ctx, info) {
		t.Fatal("not alive after start")
	}
	for i := 0; i < 2; i++ { // the second stop finds nothing and must succeed
		if err := b.StopSession(ctx, info); err != nil {
			t.Fatalf("StopSession #%d: %v", i+1, err)
		}
	}
	if _, err := cli.ContainerInspect(ctx, info.BackendSessionID); !cerrdefs.IsNotFound(err) {
		t.Errorf("container still there: %v", err)
	}
	if _, err := cli.VolumeInspect(ctx, vol); !cerrdefs.IsNotFound(err) {
		t.Errorf("volume still there: %v", err)
	}
	if b.Alive(ctx, info) {
		t.Error("Alive after stop")
	}
	_, err = b.Exec(ctx, info, backends.ExecRequest{Cmd: "true", Timeout: time.Second})
	if !isKind(err, boxerr.ErrSessionNotFound) {
		t.Errorf("Exec on a stopped session: %v, want BoxSessionNotFoundError", err)
	}
}

func TestStopSessionRefusesOtherInstance(t *testing.T) {
	t.Parallel()
	a, other := newBackend(t), newBackend(t)
	info := startSession(t, other)
	if err := a.StopSession(context.Background(), info); err == nil {
		t.Fatal("a backend removed another instance's container")
	}
	if !other.Alive(context.Background(), info) {
		t.Fatal("other instance's session died")
	}
}

func TestAdopt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := rawClient(t)
	b := newBackend(t)
	other := newBackend(t)

	s1 := startSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "adopt one" })
	s2 := startSession(t, b, func(s *backends.SandboxSpec) {
		s.SessionID = "adopt two"
		if !onGVisor(t) { // refused there: gVisor's netstack bypasses the proxy
			s.Network = backends.NetworkOn
		}
		s.PidsLimit = 77
		s.Persistent = true
	})
	gone := startSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "adopt exited" })
	persistentStopped := startSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "adopt persistent stopped"; s.Persistent = true })
	foreign := startSession(t, other, func(s *backends.SandboxSpec) { s.SessionID = "adopt foreign" })
	mustRun(t, b, persistentStopped, "echo kept > /workspace/kept")

	for _, name := range []string{gone.BackendSessionID, persistentStopped.BackendSessionID} {
		if err := cli.ContainerKill(ctx, name, "KILL"); err != nil {
			t.Fatal(err)
		}
		waitState(t, name, "exited")
	}

	// A restarted boxrt: a new backend with the same instance id, the
	// first one gone (its agents' sockets too).
	_ = b.Close()
	restartedCfg := testConfig(t, instanceOf(t, s1))
	restarted, err := docker.New(restartedCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
	adopted, err := restarted.Adopt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]backends.Session{}
	for _, a := range adopted {
		byID[a.SessionID] = a
	}
	if len(adopted) != 3 {
		t.Errorf("adopted %d sessions, want 3: %+v", len(adopted), adopted)
	}
	for _, want := range []backends.Session{s1, s2, persistentStopped} {
		got, ok := byID[want.SessionID]
		if !ok {
			t.Errorf("session %q not adopted", want.SessionID)
			continue
		}
		if !got.CreatedAt.Equal(want.CreatedAt) {
			t.Errorf("%s: CreatedAt %v, want %v", want.SessionID, got.CreatedAt, want.CreatedAt)
		}
		if time.Since(got.LastUsedAt) > time.Minute {
			t.Errorf("%s: LastUsedAt %v", want.SessionID, got.LastUsedAt)
		}
		got.CreatedAt, got.LastUsedAt, want.CreatedAt, want.LastUsedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if !equalInfo(got, want) {
			t.Errorf("adopted %+v\nwant    %+v", got, want)
		}
	}
	if _, ok := byID[foreign.SessionID]; ok {
		t.Error("adopted another instance's session")
	}
	if _, ok := byID[gone.SessionID]; ok {
		t.Error("adopted an exited non-persistent session")
	}
	if _, err := cli.ContainerInspect(ctx, gone.BackendSessionID); !cerrdefs.IsNotFound(err) {
		t.Errorf("exited non-persistent container not removed: %v", err)
	}
	if _, err := cli.VolumeInspect(ctx, "boxrt-ws-"+gone.BackendSessionID); !cerrdefs.IsNotFound(err) {
		t.Errorf("its volume not removed: %v", err)
	}
	if !other.Alive(ctx, foreign) {
		t.Error("another instance's session was touched")
	}
	if got := mustRun(t, restarted, byID[persistentStopped.SessionID], "cat /workspace/kept"); got != "kept\n" {
		t.Errorf("restarted persistent session lost its workspace: %q", got)
	}
	if s2.Network.Egress() && restartedCfg.Egress.Session(s2.SessionID) == nil {
		t.Error("the adopted session with network is not attached to the new egress proxy")
	}
	if got := mustRun(t, restarted, byID[s1.SessionID], "echo adopted"); got != "adopted\n" {
		t.Errorf("exec in adopted session: %q", got)
	}
}

func equalInfo(a, b backends.Session) bool {
	return a.SessionID == b.SessionID && a.BackendName == b.BackendName && a.BackendSessionID == b.BackendSessionID &&
		a.Image == b.Image && a.Network == b.Network && a.HostPath == b.HostPath && a.HostPathMode == b.HostPathMode &&
		a.MountPath == b.MountPath && slices.Equal(a.ExtraMounts, b.ExtraMounts) && a.Persistent == b.Persistent &&
		a.CPUs == b.CPUs && a.MemoryMB == b.MemoryMB && a.PidsLimit == b.PidsLimit &&
		a.ReadOnlyRootfs == b.ReadOnlyRootfs && a.WorkspaceQuotaMB == b.WorkspaceQuotaMB
}

func instanceOf(t *testing.T, info backends.Session) string {
	c, err := rawClient(t).ContainerInspect(context.Background(), info.BackendSessionID)
	if err != nil {
		t.Fatal(err)
	}
	return c.Config.Labels[docker.LabelInstance]
}

func waitState(t *testing.T, name, state string) {
	t.Helper()
	cli := rawClient(t)
	for i := 0; i < 100; i++ {
		c, err := cli.ContainerInspect(context.Background(), name)
		if err == nil && c.State.Status == state {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("container %s never reached state %s", name, state)
}

func TestHostPathMounts(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(root, "ws", "nested") // missing: created for rw
	data := filepath.Join(root, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "in.txt"), []byte("from host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	info := startSession(t, b, func(s *backends.SandboxSpec) {
		s.HostPath = ws
		s.HostPathMode = backends.MountRW
		s.ExtraMounts = []backends.MountSpec{
			{HostPath: data, MountPath: "/data", Mode: backends.MountRO},
			{HostPath: filepath.Join(root, "ignored"), MountPath: "/ignored", Mode: backends.MountNone},
		}
	})
	if len(info.ExtraMounts) != 1 {
		t.Errorf("info.ExtraMounts %+v, want only the active mount", info.ExtraMounts)
	}
	mustRun(t, b, info, "echo from sandbox > /workspace/out.txt")
	got, err := os.ReadFile(filepath.Join(ws, "out.txt"))
	if err != nil || string(got) != "from sandbox\n" {
		t.Fatalf("host sees %q, %v", got, err)
	}
	if got := mustRun(t, b, info, "cat /data/in.txt"); got != "from host\n" {
		t.Errorf("ro mount reads %q", got)
	}
	if r := run(t, b, info, "echo x > /data/new", 10*time.Second); r.status.ExitCode == 0 {
		t.Error("wrote into a read-only mount")
	}
	if r := run(t, b, info, "ls /ignored", 10*time.Second); r.status.ExitCode == 0 {
		t.Error("mode none mount was bound")
	}
	if _, err := rawClient(t).VolumeInspect(context.Background(), "boxrt-ws-"+info.BackendSessionID); !cerrdefs.IsNotFound(err) {
		t.Errorf("a workspace volume was created although host_path is bound: %v", err)
	}

	spec := testSpec(t)
	spec.SessionID += "-missing-ro"
	spec.HostPath = filepath.Join(root, "missing")
	spec.HostPathMode = backends.MountRO
	if _, err := b.StartSession(context.Background(), spec); !isKind(err, boxerr.ErrValidation) {
		t.Errorf("missing read-only host path: %v, want BoxValidationError", err)
	}
}
