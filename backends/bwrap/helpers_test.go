package bwrap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/internal/egress"
	"github.com/boxrt/boxrt/internal/sandboxagent/agenttest"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		// Started as a session's agent (TestHostileAgent).
		os.Exit(testAgent(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

// requireBwrap skips loudly under -short and fails (never skips) when
// bubblewrap is missing: CI machines must have it.
func requireBwrap(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("SKIPPED under -short: this test runs real bubblewrap sandboxes")
	}
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatalf("bubblewrap is required for this test and is missing (apt-get install bubblewrap): %v", err)
	}
}

var instanceSeq struct {
	sync.Mutex
	n int
}

func testInstanceID(t *testing.T) string {
	instanceSeq.Lock()
	defer instanceSeq.Unlock()
	instanceSeq.n++
	return "test-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(instanceSeq.n)
}

// newBackend makes a probed Backend with its own instance id and state dir,
// and checks at cleanup that it left no cgroup behind.
func newBackend(t *testing.T) *Backend {
	t.Helper()
	requireBwrap(t)
	return newBackendAt(t, t.TempDir(), testInstanceID(t))
}

// workspaceOnHost is where a session's workspace lives on the host.
func workspaceOnHost(b *Backend, info backends.Session) string {
	info.HostPath = ""
	dir, _ := b.HostDir(info, info.MountPathOrDefault())
	return dir
}

// conformanceEnv is a new backend as the tests every backend shares
// (backendtest) take it: sessions run as root of their user namespace,
// /home is served by the file API, and a process left behind shows on the
// host.
func conformanceEnv(t *testing.T) backendtest.Env {
	t.Helper()
	b := newBackend(t)
	return backendtest.Env{
		Backend: b,
		Spec: func(name string) backends.SandboxSpec {
			s := backends.DefaultSandboxSpec()
			s.SessionID = t.Name() + "/" + name
			return s
		},
		KernelShared: true,
		FileUID:      0,
		FileDirs:     []string{"/home"},
		NoProcesses:  func(t *testing.T, _ backends.Session, marker string) { assertNoHostProcs(t, marker) },
	}
}

func newBackendAt(t *testing.T, stateDir, instance string) *Backend {
	t.Helper()
	proxy, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close) // after the backend's own cleanup
	b, err := New(Config{InstanceID: instance, StateDir: stateDir, AgentBinary: agenttest.Binary(t), Egress: proxy})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := b.Probe(context.Background()); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		if leaves := b.cg.leaves(instance); len(leaves) > 0 {
			t.Errorf("cgroups left behind for instance %s: %v", instance, leaves)
		}
		// Empty unless a session's stage (its mounts) was left behind.
		if err := os.Remove(filepath.Join(stageRoot, instance)); err != nil && !os.IsNotExist(err) {
			t.Errorf("stage of instance %s left behind: %v", instance, err)
		}
	})
	return b
}

// newSession starts a session from the reference defaults, adjusted by
// mutate, and stops it at cleanup.
func newSession(t *testing.T, b *Backend, mutate func(*backends.SandboxSpec)) backends.Session {
	t.Helper()
	spec := backends.DefaultSandboxSpec()
	spec.SessionID = t.Name()
	if mutate != nil {
		mutate(&spec)
	}
	return backendtest.Start(t, b, spec)
}

// syncBuffer is a goroutine-safe writer that also counts bytes and records
// when the first byte arrived.
type syncBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	n     int64
	first time.Time
	keep  bool
}

func newBuf() *syncBuffer { return &syncBuffer{keep: true} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 && len(p) > 0 {
		s.first = time.Now()
	}
	s.n += int64(len(p))
	if s.keep {
		s.buf.Write(p)
	}
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func (s *syncBuffer) Len() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

type execResult struct {
	stdout, stderr string
	status         backends.ExitStatus
	err            error
	elapsed        time.Duration
}

func execIn(t *testing.T, b *Backend, info backends.Session, req backends.ExecRequest) execResult {
	t.Helper()
	return runCtx(context.Background(), t, b, info, req)
}

func runCtx(ctx context.Context, t *testing.T, b *Backend, info backends.Session, req backends.ExecRequest) execResult {
	t.Helper()
	out, errb := newBuf(), newBuf()
	req.Stdout, req.Stderr = out, errb
	if req.Timeout == 0 {
		req.Timeout = 30 * time.Second
	}
	start := time.Now()
	st, err := b.Exec(ctx, info, req)
	return execResult{stdout: out.String(), stderr: errb.String(), status: st, err: err, elapsed: time.Since(start)}
}

// mustRun runs cmd and fails the test unless it exits 0.
func mustRun(t *testing.T, b *Backend, info backends.Session, cmd string) string {
	t.Helper()
	r := execIn(t, b, info, backends.ExecRequest{Cmd: cmd})
	if r.err != nil || r.status.TimedOut || r.status.ExitCode != 0 {
		t.Fatalf("exec %q: err=%v status=%+v stdout=%q stderr=%q", cmd, r.err, r.status, r.stdout, r.stderr)
	}
	return r.stdout
}

// mark makes a process-marker unique to this test binary run: sleep
// durations like 60.0417<pid> (still valid numbers), so concurrent test runs
// on one machine (CI running packages in parallel, a developer's run next
// to CI's) never mistake each other's processes for leftovers.
// The pid is zero-padded to a fixed width so no marker is a prefix of
// another.
func mark(base string) string { return fmt.Sprintf("%s%07d", base, os.Getpid()) }

// hostProcsWith lists host processes whose command line contains marker.
func hostProcsWith(marker string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == self {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(data), "\x00", " ")
		if strings.Contains(cmd, marker) {
			out = append(out, e.Name()+": "+cmd)
		}
	}
	return out
}

// assertNoHostProcs fails unless no process with marker exists (allowing a
// moment for the kernel to finish tearing a namespace down).
func assertNoHostProcs(t *testing.T, marker string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := hostProcsWith(marker)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left on the host with %q: %v", marker, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// machineHasController reports whether this machine offers the cgroup
// controller at all (v1 hierarchy mounted, or listed by the v2 root).
func machineHasController(name string) bool {
	if data, err := os.ReadFile("/proc/cgroups"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 4 && f[0] == name && f[1] != "0" && f[3] == "1" {
				return true
			}
		}
	}
	for _, c := range readWords("/sys/fs/cgroup/cgroup.controllers") {
		if c == name {
			return true
		}
	}
	return false
}
