package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// ProbeDir is where the escape probe is bound (read-only) in a sandbox.
const ProbeDir = "/opt/boxrt-escape"

// Env is a backend under test, how to make a session spec for it, and
// what its sessions look like where backends legitimately differ. Each
// conformance function says which fields it reads.
type Env struct {
	Backend backends.Backend
	// Spec returns a spec of a session for this backend (image, session
	// id from name, unique within the test); the conformance functions add
	// their limits and mounts, start the session and stop it at cleanup.
	Spec func(name string) backends.SandboxSpec
	// KernelShared is false where the sandbox's syscalls are served by a
	// kernel of its own (gVisor): there a namespace a sandbox makes is the
	// sentry's, not the host kernel's, and contained (RunEscapeTests).
	KernelShared bool
	// FileUID is the owner, as the sandbox sees it, of a file written
	// through the file API: the sandbox's user (Files).
	FileUID int
	// FileDirs are directories beyond /workspace, /tmp and the extra
	// mounts where the file API serves a writable view (bwrap: /home)
	// (Files).
	FileDirs []string
	// NoProcesses fails t unless, within a few seconds, no process whose
	// command line contains marker is left of info's session (LiveExec).
	NoProcesses func(t *testing.T, info backends.Session, marker string)
	// Ready, when set, waits until a started session runs commands the
	// way the shared cases mean (kube: through its agent, not the
	// fallback of one exec per command while the agent is uploaded)
	// (LiveExec).
	Ready func(t *testing.T, info backends.Session)
}

// outcome is what one attempt produced.
type outcome struct {
	out    string
	status backends.ExitStatus
	err    error
}

// host is what the cases compare a sandbox's view with.
type host struct {
	shadow     string   // the host's /etc/shadow
	writes     []string // host paths a sandbox must not be able to create
	listener   string   // a host TCP listener on loopback
	marker     string   // in the command line of another session's process
	victimPids []string // host pids of that process (none on gVisor)
}

// escapeCase is one thing a sandbox must not be able to do.
type escapeCase struct {
	name string
	// limits changes the session's limits for the case.
	limits func(*backends.SandboxSpec)
	cmd    func(h *host) string
	// escaped returns what got out, "" when contained.
	escaped func(e Env, h *host, o outcome) string
}

func probe(args ...string) string { return ProbeDir + "/escapeprobe " + strings.Join(args, " ") }

// denied checks that the probe reported each attempt, by name, as denied:
// it returns what was granted, and what the probe did not report at all
// (it did not run, or printed something else), "" when every attempt was
// denied. A case passes only on the probe's own word, never on silence.
func denied(out string, attempts ...string) string {
	var bad []string
	for _, a := range attempts {
		switch verdict(out, a) {
		case "denied":
		case "ok":
			bad = append(bad, a+" was granted")
		default:
			bad = append(bad, fmt.Sprintf("no %q line from the probe (did it run?); output %q", a+"=denied", out))
		}
	}
	return strings.Join(bad, "; ")
}

// verdict is the probe's word on attempt: "ok", "denied", or "" when it
// printed no line for it.
func verdict(out, attempt string) string {
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, attempt+"="); ok {
			if v == "ok" {
				return "ok"
			}
			if strings.HasPrefix(v, "denied") {
				return "denied"
			}
		}
	}
	return ""
}

// sessionEnded is a sandbox a limit brought down as a whole (gVisor's
// sentry is what the OOM killer or the pids limit hits): contained. The
// backend says so as a gone session, or, where a session agent ran the
// command, as an error saying the sandbox was restarted.
func sessionEnded(o outcome) bool {
	var be *boxerr.Error
	return errors.Is(o.err, boxerr.ErrSessionNotFound) || errors.As(o.err, &be) && be.Details["restarted"] == true
}

const (
	escapePidsLimit = 32
	escapeMemoryMB  = 64
)

// escapeCases is the one table of escape attempts. Each case passes only
// on positive evidence that the attempt ran and was stopped (the probe's
// "=denied" line, or the limit's kill): a probe that did not run fails.
var escapeCases = []escapeCase{
	{
		name: "read host /etc/shadow",
		cmd:  func(*host) string { return probe("read", "/etc/shadow") },
		escaped: func(_ Env, h *host, o outcome) string {
			if h.shadow != "" && strings.Contains(o.out, h.shadow) {
				return "the sandbox read the host's /etc/shadow"
			}
			return denied(o.out, "read")
		},
	},
	{
		name: "write outside the workspace",
		cmd:  func(h *host) string { return probe(append([]string{"write"}, h.writes...)...) },
		escaped: func(_ Env, h *host, o outcome) string {
			var got []string
			for _, p := range h.writes {
				if _, err := os.Stat(p); err == nil {
					got = append(got, p)
				}
			}
			if len(got) > 0 {
				return "created " + strings.Join(got, ", ")
			}
			// A sandbox's own /tmp is writable, so "=ok" is no escape
			// there: only a host file is; but the probe must have tried
			// every path.
			return ran(o.out, h.writes, "write ")
		},
	},
	{
		name:    "mount",
		cmd:     func(*host) string { return probe("mount") },
		escaped: func(_ Env, _ *host, o outcome) string { return denied(o.out, "mount tmpfs", "mount proc") },
	},
	{
		name: "unshare",
		// The probe's clone with namespace flags, and unshare(2) itself
		// from a single-threaded program where the image has one.
		cmd: func(*host) string {
			return probe("unshare") + "; if command -v unshare >/dev/null; then unshare -U true && echo 'unshare(1) -U=ok'; fi"
		},
		escaped: func(e Env, _ *host, o outcome) string {
			attempts := []string{"unshare user", "unshare mount", "unshare net"}
			if !e.KernelShared {
				// Namespaces of the sandbox's own kernel: allowed, but
				// the probe must have tried.
				return ran(o.out, attempts, "")
			}
			if verdict(o.out, "unshare(1) -U") == "ok" {
				return "unshare(1) -U was granted"
			}
			return denied(o.out, attempts...)
		},
	},
	{
		name:    "raw sockets",
		cmd:     func(*host) string { return probe("rawsock") },
		escaped: func(_ Env, _ *host, o outcome) string { return denied(o.out, "socket inet raw", "socket packet") },
	},
	{
		// A vsock reaches the hypervisor past every namespace.
		name:    "vsock socket",
		cmd:     func(*host) string { return probe("vsock") },
		escaped: func(_ Env, _ *host, o outcome) string { return denied(o.out, "socket vsock") },
	},
	{
		name:    "reach a host listener with network off",
		cmd:     func(h *host) string { return probe("connect", h.listener) },
		escaped: func(_ Env, h *host, o outcome) string { return denied(o.out, "connect "+h.listener) },
	},
	{
		name:   "fork bomb under the pids limit",
		limits: func(s *backends.SandboxSpec) { s.PidsLimit = escapePidsLimit },
		cmd:    func(*host) string { return probe("forkbomb", "400") },
		escaped: func(_ Env, _ *host, o outcome) string {
			if sessionEnded(o) {
				return ""
			}
			n := -1
			for _, l := range strings.Split(o.out, "\n") {
				if v, ok := strings.CutPrefix(l, "started="); ok {
					n, _ = strconv.Atoi(v)
				}
			}
			// A kernel that shares its pids with the sandbox's threads
			// (gVisor) grants fewer; none may grant more than twice the
			// limit, and the limit must have stopped the bomb.
			if n < 0 || n >= 2*escapePidsLimit {
				return fmt.Sprintf("started %d processes under pids_limit %d (output %q, err %v)", n, escapePidsLimit, o.out, o.err)
			}
			return denied(o.out, "fork")
		},
	},
	{
		name:   "memory hog under the memory limit",
		limits: func(s *backends.SandboxSpec) { s.MemoryMB = escapeMemoryMB },
		cmd:    func(*host) string { return probe("memhog", strconv.Itoa(4*escapeMemoryMB)) },
		escaped: func(_ Env, _ *host, o outcome) string {
			switch {
			case strings.Contains(o.out, "allocated="):
				return fmt.Sprintf("allocated %d MB under memory_mb %d", 4*escapeMemoryMB, escapeMemoryMB)
			case sessionEnded(o):
				return ""
			case o.err != nil:
				return fmt.Sprintf("unexpected error %v", o.err)
			case !strings.Contains(o.out, "memhog=start"):
				return fmt.Sprintf("the probe did not start (output %q)", o.out)
			case o.status.ExitCode != 128+9:
				return fmt.Sprintf("exit code %d, want 137 (killed by the memory limit); output %q", o.status.ExitCode, o.out)
			}
			return ""
		},
	},
	{
		name: "ptrace of another session's process",
		cmd: func(h *host) string {
			return probe(append([]string{"ptrace", h.marker[:2], h.marker[2:]}, h.victimPids...)...)
		},
		escaped: func(_ Env, _ *host, o outcome) string {
			var attempts []string
			seen := false
			for _, l := range strings.Split(o.out, "\n") {
				v, ok := strings.CutPrefix(l, "visible=")
				if !ok {
					continue
				}
				seen = true
				if pid, _, _ := strings.Cut(v, " "); pid != "none" {
					attempts = append(attempts, "ptrace "+pid)
				}
			}
			if !seen {
				return fmt.Sprintf("no visible= line from the probe (did it run?); output %q", o.out)
			}
			return denied(o.out, attempts...)
		},
	},
}

// ran checks that the probe printed a verdict, either way, for each of
// prefix+attempt.
func ran(out string, attempts []string, prefix string) string {
	var missing []string
	for _, a := range attempts {
		if verdict(out, prefix+a) == "" {
			missing = append(missing, prefix+a)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("no line from the probe for %s (did it run?); output %q", strings.Join(missing, ", "), out)
}

// RunEscapeTests runs every escape case in its own session of env and
// fails each case whose attempt was not contained.
func RunEscapeTests(t *testing.T, env Env) {
	t.Helper()
	dir := buildProbe(t)
	h := newHost(t, env)
	for _, tc := range escapeCases {
		t.Run(tc.name, func(t *testing.T) {
			spec := env.Spec("escape-" + tc.name)
			spec.Network = backends.NetworkOff
			spec.ExtraMounts = append(spec.ExtraMounts, backends.MountSpec{HostPath: dir, MountPath: ProbeDir, Mode: backends.MountRO})
			if tc.limits != nil {
				tc.limits(&spec)
			}
			info := Start(t, env.Backend, spec)
			var out SyncBuffer
			st, err := env.Backend.Exec(context.Background(), info, backends.ExecRequest{
				Cmd: tc.cmd(h) + " 2>&1", Timeout: 90 * time.Second, Stdout: &out, Stderr: &out})
			o := outcome{out: out.String(), status: st, err: err}
			t.Logf("%s: status %+v err %v\n%s", tc.name, st, err, o.out)
			if st.TimedOut {
				t.Fatalf("the attempt did not end in 90 s")
			}
			if what := tc.escaped(env, h, o); what != "" {
				t.Errorf("NOT CONTAINED: %s", what)
			}
		})
	}
}

// newHost prepares the host side: the shadow file to compare with, the
// paths a write must not create, a loopback listener, and a victim process
// in a session of its own.
func newHost(t *testing.T, env Env) *host {
	h := &host{marker: fmt.Sprintf("31%d", time.Now().UnixNano()%1000000)}
	if b, err := os.ReadFile("/etc/shadow"); err == nil {
		h.shadow = strings.TrimSpace(string(b))
	}
	tag := fmt.Sprintf("boxrt-escape-%d-%d", os.Getpid(), time.Now().UnixNano())
	for _, d := range []string{"/", "/etc", "/tmp", "/var/tmp", "/root"} {
		p := filepath.Join(d, tag)
		h.writes = append(h.writes, p)
		t.Cleanup(func() { _ = os.Remove(p) })
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	h.listener = ln.Addr().String()

	victim := Start(t, env.Backend, env.Spec("escape-victim"))
	p, err := env.Backend.StartProcess(context.Background(), victim, backends.ProcessSpec{ProcessID: "victim", Command: "sleep", Args: []string{h.marker}})
	if err != nil {
		t.Fatalf("starting the victim process: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Signal(9)
		_, _ = p.Wait()
	})
	time.Sleep(500 * time.Millisecond)
	h.victimPids = hostPids(h.marker)
	return h
}

// hostPids finds host processes whose command line contains marker.
func hostPids(marker string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(marker)) {
			out = append(out, e.Name())
		}
	}
	return out
}

func Start(t *testing.T, b backends.Backend, spec backends.SandboxSpec) backends.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	info, err := b.StartSession(ctx, spec)
	if err != nil {
		t.Fatalf("StartSession: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := b.StopSession(ctx, info); err != nil {
			t.Errorf("StopSession: %v", err)
		}
	})
	return info
}

// buildProbe builds escapeprobe static into a world-readable directory
// (sandbox users are not the test's user), removed when the test ends.
func buildProbe(t *testing.T) string {
	dir, err := os.MkdirTemp("", "boxrt-escapeprobe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := goruntime.Caller(0)
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "escapeprobe"), "./test/fixtures/escape")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building escapeprobe: %v\n%s", err, out)
	}
	return dir
}

// SyncBuffer is a bytes.Buffer safe to read while an exec's concurrent
// writers write to it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
