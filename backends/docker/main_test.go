package docker_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
	"github.com/boxrt/boxrt/internal/sandboxagent"
	"github.com/boxrt/boxrt/internal/sandboxagent/agenttest"
)

// testImage is built by scripts/build-test-image: static busybox, USER
// 1000:1000, /workspace owned by 1000.
const testImage = "boxrt-test:busybox"

// setupErr is why the engine or the test image is unusable; every
// integration test fails with it rather than skipping.
var setupErr error

// The test matrix: scripts/test runs this package once per engine/runtime
// (dockerd with runc, dockerd with runsc, Podman's Docker-compatible API).
// BOXRT_TEST_DOCKER_HOST becomes DOCKER_HOST for the backend and the raw
// client alike; BOXRT_TEST_DOCKER_RUNTIME is the backend's Config.Runtime
// (and its GVisorRuntime, so specs asking for gVisor are served too).
var (
	matrixHost    = os.Getenv("BOXRT_TEST_DOCKER_HOST")
	matrixRuntime = os.Getenv("BOXRT_TEST_DOCKER_RUNTIME")
)

// matrixName names the matrix entry in failure messages.
func matrixName() string {
	host, rt := matrixHost, matrixRuntime
	if host == "" {
		host = "default engine"
	}
	if rt == "" {
		rt = "default runtime"
	}
	return host + ", " + rt
}

// testConfig is the backend configuration every test starts from: the
// matrix entry's runtime, the test image, and the given instance id.
// Sessions run their commands through the session agent: a static boxrt
// built for the test, with its sockets under a state directory shared by
// every backend of the test process (tests that need their own set one).
func testConfig(t testing.TB, instance string) docker.Config {
	proxy, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the backend's own cleanup.
	t.Cleanup(proxy.Close)
	return docker.Config{InstanceID: instance, DefaultImage: testImage, Runtime: matrixRuntime, GVisorRuntime: matrixRuntime,
		AgentBinary: agenttest.Binary(t), StateDir: sharedStateDir, Egress: proxy}
}

// sharedStateDir is made by TestMain and removed after the tests.
var sharedStateDir string

// onGVisor tells whether this matrix entry runs sessions under gVisor.
func onGVisor(t *testing.T) bool {
	b, err := docker.New(testConfig(t, "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	return b.OnGVisor(backends.Sandbox{})
}

// engineExecs makes a backend run commands through Engine execs, as it
// does where the agent cannot serve (gVisor, a remote engine).
func engineExecs(c *docker.Config) { c.AgentBinary = "" }

// usesAgent tells whether this matrix entry's sessions run their commands
// through the session agent: everywhere, on gVisor too when the engine
// registered its runtime with --host-uds=open (scripts/setup does).
func usesAgent(t *testing.T) bool {
	b, err := docker.New(testConfig(t, "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	agent, err := b.UsesAgent(context.Background(), backends.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	return agent
}

// sandboxEnded tells whether err says the session's sandbox ended as a
// whole: gone (Engine execs) or restarted after its agent was lost.
func sandboxEnded(err error) bool {
	var be *boxerr.Error
	return isKind(err, boxerr.ErrSessionNotFound) || errors.As(err, &be) && be.Details["restarted"] == true
}

// onPodman tells whether the engine is Podman's Docker-compatible API.
func onPodman(t *testing.T) bool {
	v, err := rawClient(t).ServerVersion(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range v.Components {
		if strings.Contains(c.Name, "Podman") {
			return true
		}
	}
	return false
}

// cgroupPids is the pids cgroup limit a session with pids_limit n gets in
// this matrix entry (scaled on gVisor, see Backend.PidsCgroupLimit; the
// agent's threads added where it serves).
func cgroupPids(t *testing.T, n int) int64 {
	b, err := docker.New(testConfig(t, "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sb := backends.Sandbox{PidsLimit: n}
	agent, err := b.UsesAgent(context.Background(), sb)
	if err != nil {
		t.Fatal(err)
	}
	if agent {
		return b.PidsCgroupLimit(sb) + sandboxagent.MaxThreads
	}
	return b.PidsCgroupLimit(sb)
}

func TestMain(m *testing.M) {
	flag.Parse()
	if matrixHost != "" {
		// Before any client is built: both read DOCKER_HOST from the
		// environment.
		os.Setenv("DOCKER_HOST", matrixHost)
	}
	fmt.Fprintf(os.Stderr, "backends/docker: testing against %s\n", matrixName())
	dir, err := os.MkdirTemp("", "boxrt-docker-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	sharedStateDir = dir
	if testing.Short() {
		fmt.Fprintln(os.Stderr, "\n!!! -short: SKIPPING every Docker Engine integration test in backends/docker !!!")
	} else {
		setupErr = setup()
		if setupErr != nil {
			fmt.Fprintf(os.Stderr, "\n!!! backends/docker: Docker Engine integration tests cannot run: %v !!!\n\n", setupErr)
		}
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(sharedStateDir)
		os.Exit(code)
	}))
}

// setup checks the engine and builds the test image when it is missing.
func setup() error {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		return fmt.Errorf("engine not reachable at %s (start dockerd or set DOCKER_HOST): %w", cli.DaemonHost(), err)
	}
	if _, err := cli.ImageInspect(ctx, testImage); err == nil {
		return nil
	}
	if matrixHost != "" {
		// build-test-image builds into dockerd; scripts/setup imports the
		// image into Podman's store.
		return fmt.Errorf("%s is not in the engine at %s: run scripts/setup", testImage, matrixHost)
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "build-test-image")
	cmd := exec.CommandContext(ctx, script)
	cmd.Env = append(os.Environ(), "BOXRT_TEST_IMAGE="+testImage)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s failed: %v\n%s", script, err, out)
	}
	if _, err := cli.ImageInspect(ctx, testImage); err != nil {
		return fmt.Errorf("%s ran but %s is still missing: %w", script, testImage, err)
	}
	return nil
}

func needEngine(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("!!! SKIPPED: needs a Docker Engine (-short) !!!")
	}
	if setupErr != nil {
		t.Fatalf("Docker Engine integration test cannot run (%s): %v", matrixName(), setupErr)
	}
}

// rawClient is a plain Engine API client for checking what the backend did.
func rawClient(t *testing.T) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func instanceID() string {
	return fmt.Sprintf("boxrt-test-%d-%d", os.Getpid(), time.Now().UnixNano())
}

// newBackend returns a backend with its own instance id; everything created
// under that id is removed when the test ends, whatever the test did.
func newBackend(t *testing.T, mutate ...func(*docker.Config)) *docker.Backend {
	t.Helper()
	needEngine(t)
	cfg := testConfig(t, instanceID())
	for _, m := range mutate {
		m(&cfg)
	}
	b, err := docker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cli := rawClient(t)
	t.Cleanup(func() {
		_ = b.Close()
		removeInstance(t, cli, cfg.InstanceID)
	})
	return b
}

func removeInstance(t *testing.T, cli *client.Client, instance string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", docker.LabelInstance+"="+instance))
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Errorf("cleanup: listing containers: %v", err)
		return
	}
	for _, c := range list {
		if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			t.Errorf("cleanup: removing %v: %v", c.Names, err)
		}
	}
	vols, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		t.Errorf("cleanup: listing volumes: %v", err)
		return
	}
	for _, v := range vols.Volumes {
		if err := cli.VolumeRemove(ctx, v.Name, true); err != nil {
			t.Errorf("cleanup: removing volume %s: %v", v.Name, err)
		}
	}
}

// conformanceEnv is a new backend as the tests every backend shares
// (backendtest) take it: sessions of the test image (user 1000), in this
// matrix entry's runtime, whose leftover processes show in the container.
func conformanceEnv(t *testing.T, opts ...func(*docker.Config)) backendtest.Env {
	t.Helper()
	b := newBackend(t, opts...)
	return backendtest.Env{
		Backend: b,
		Spec: func(name string) backends.SandboxSpec {
			s := testSpec(t)
			s.SessionID = "t/" + t.Name() + "/" + name
			return s
		},
		KernelShared: !onGVisor(t),
		FileUID:      1000,
		NoProcesses: func(t *testing.T, info backends.Session, marker string) {
			waitNoProcesses(t, b, info, marker)
		},
	}
}

func testSpec(t *testing.T) backends.SandboxSpec {
	s := backends.DefaultSandboxSpec()
	s.SessionID = "t/" + t.Name()
	s.Image = testImage
	s.MemoryMB = 256
	return s
}

// startSession starts a session from the default test spec as changed by
// mutate and stops it when the test ends.
func startSession(t *testing.T, b *docker.Backend, mutate ...func(*backends.SandboxSpec)) backends.Session {
	t.Helper()
	spec := testSpec(t)
	for _, m := range mutate {
		m(&spec)
	}
	return backendtest.Start(t, b, spec)
}

type result struct {
	stdout, stderr string
	status         backends.ExitStatus
	err            error
	elapsed        time.Duration
}

func run(t *testing.T, b *docker.Backend, info backends.Session, cmd string, timeout time.Duration) result {
	t.Helper()
	return runCtx(context.Background(), t, b, info, backends.ExecRequest{Cmd: cmd, Timeout: timeout})
}

func runCtx(ctx context.Context, t *testing.T, b *docker.Backend, info backends.Session, req backends.ExecRequest) result {
	t.Helper()
	var out, errOut backendtest.SyncBuffer
	req.Stdout, req.Stderr = &out, &errOut
	start := time.Now()
	st, err := b.Exec(ctx, info, req)
	return result{stdout: out.String(), stderr: errOut.String(), status: st, err: err, elapsed: time.Since(start)}
}

// mustRun runs cmd and fails the test unless it completes with exit code 0.
func mustRun(t *testing.T, b *docker.Backend, info backends.Session, cmd string) string {
	t.Helper()
	r := run(t, b, info, cmd, 30*time.Second)
	if r.err != nil || r.status.TimedOut || r.status.ExitCode != 0 {
		t.Fatalf("exec %q: status %+v err %v\nstdout: %s\nstderr: %s", cmd, r.status, r.err, r.stdout, r.stderr)
	}
	return r.stdout
}

// processesMatching lists the command lines of processes in the session
// (other than the listing itself) that contain substr.
func processesMatching(t *testing.T, b *docker.Backend, info backends.Session, substr string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(mustRun(t, b, info, backendtest.ListProcesses), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// waitNoProcesses polls until no process matches substr; killed processes
// can take a moment to be reaped by the container's init.
func waitNoProcesses(t *testing.T, b *docker.Backend, info backends.Session, substr string) {
	t.Helper()
	var left []string
	for i := 0; i < 20; i++ {
		if left = processesMatching(t, b, info, substr); len(left) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("processes matching %q still running: %q", substr, left)
}

func isKind(err, kind error) bool { return errors.Is(err, kind) }
