package docker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

func TestExec(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)

	tests := []struct {
		name       string
		req        backends.ExecRequest
		wantOut    string
		wantErr    string
		wantCode   int
		outIsExact bool
	}{
		{name: "echo", req: backends.ExecRequest{Cmd: "echo hello"}, wantOut: "hello\n", outIsExact: true},
		{name: "stderr and exit code", req: backends.ExecRequest{Cmd: "echo oops >&2; exit 3"}, wantErr: "oops\n", wantCode: 3},
		{name: "env", req: backends.ExecRequest{Cmd: `echo "$GREETING $OTHER"`, Env: map[string]string{"GREETING": "hi there", "OTHER": "x=y"}}, wantOut: "hi there x=y\n", outIsExact: true},
		{name: "workdir is created", req: backends.ExecRequest{Cmd: "pwd", Workdir: "/workspace/a/b c"}, wantOut: "/workspace/a/b c\n", outIsExact: true},
		{name: "default workdir is the mount path", req: backends.ExecRequest{Cmd: "pwd"}, wantOut: "/workspace\n", outIsExact: true},
		{name: "quotes are not reinterpreted", req: backends.ExecRequest{Cmd: `printf '%s|' "it's" 'a "b"' '$HOME' "\$1"`}, wantOut: `it's|a "b"|$HOME|$1|`, outIsExact: true},
		{name: "positional parameters are not leaked", req: backends.ExecRequest{Cmd: `echo "[$#][$1]"`}, wantOut: "[0][]\n", outIsExact: true},
		{name: "stdin is empty", req: backends.ExecRequest{Cmd: "cat; echo end"}, wantOut: "end\n", outIsExact: true},
		{name: "runs as the image user", req: backends.ExecRequest{Cmd: "id -u; id -g"}, wantOut: "1000\n1000\n", outIsExact: true},
		{name: "workdir not creatable", req: backends.ExecRequest{Cmd: "echo never", Workdir: "/proc/nope"}, wantErr: "mkdir", wantCode: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Timeout = 30 * time.Second
			r := runCtx(context.Background(), t, b, info, tc.req)
			if r.err != nil || r.status.TimedOut {
				t.Fatalf("status %+v err %v", r.status, r.err)
			}
			if r.status.ExitCode != tc.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", r.status.ExitCode, tc.wantCode, r.stderr)
			}
			if tc.outIsExact && r.stdout != tc.wantOut {
				t.Errorf("stdout %q, want %q", r.stdout, tc.wantOut)
			}
			if !strings.Contains(r.stderr, tc.wantErr) {
				t.Errorf("stderr %q, want it to contain %q", r.stderr, tc.wantErr)
			}
			if tc.wantCode != 0 && strings.Contains(r.stdout, "never") {
				t.Errorf("command ran although its workdir failed: %q", r.stdout)
			}
		})
	}
	waitNoPidFiles(t, b, info, ".boxrt-exec-")
	// Nor their watchers (argv "sh -c <script> boxrt-exec …").
	waitNoProcesses(t, b, info, "boxrt-exec")
}

// waitNoPidFiles polls until /run/boxrt holds no pid file starting with
// prefix other than the listing exec's own: a plain exec's watcher deletes
// its file just after the exec has answered.
func waitNoPidFiles(t *testing.T, b *docker.Backend, info backends.Session, prefix string) {
	t.Helper()
	var out strings.Builder
	for i := 0; i < 50; i++ {
		out.Reset()
		// The listing command runs in place of its wrapper: its own pid
		// file holds the shell's $$.
		_, err := b.Exec(context.Background(), info, backends.ExecRequest{
			Cmd:     `for f in /run/boxrt/` + prefix + `*; do [ -e "$f" ] && [ "$(cat "$f")" != "$$" ] && echo "$f"; done; true`,
			Stdout:  &out,
			Timeout: 10 * time.Second,
		})
		if err != nil {
			t.Fatalf("listing pid files: %v", err)
		}
		if out.Len() == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("pid files left behind: %s", out.String())
}

func TestExecFilesPersistAcrossExecs(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	mustRun(t, b, info, "echo persisted > /workspace/note.txt && mkdir -p /workspace/d && echo tmp > /tmp/t")
	if got := mustRun(t, b, info, "cat /workspace/note.txt /tmp/t; ls -d /workspace/d"); got != "persisted\ntmp\n/workspace/d\n" {
		t.Fatalf("second exec saw %q", got)
	}
}

func TestExecTimeoutKillsTreeAndKeepsSession(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	mustRun(t, b, info, "echo before > /workspace/before.txt")

	tests := []struct {
		name, cmd, marker string
	}{
		{"single command", "sleep 61", "sleep 61"},
		{"background tree", "sleep 62 & (sleep 63 & sleep 64) & echo started; sleep 65", "sleep 6"},
		{"ignores SIGTERM", `trap "" TERM; sleep 66 & wait`, "sleep 66"},
		{"escaped to init", "(sleep 67 &) ; sleep 68", "sleep 6"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, b, info, tc.cmd, 2*time.Second)
			if r.err != nil {
				t.Fatalf("Exec: %v", r.err)
			}
			if !r.status.TimedOut {
				t.Fatalf("status %+v, want timed out", r.status)
			}
			t.Logf("timed out after %v", r.elapsed)
			// Not before the timeout; the upper bound only catches a hang
			// (a loaded gVisor sandbox has taken 3.8 s to end the tree).
			if r.elapsed < 2*time.Second || r.elapsed > 30*time.Second {
				t.Errorf("Exec returned after %v, want the 2 s timeout plus the kill", r.elapsed)
			}
			waitNoProcesses(t, b, info, tc.marker)
			if got := mustRun(t, b, info, "cat /workspace/before.txt"); got != "before\n" {
				t.Fatalf("after the timeout the session lost its files: %q", got)
			}
		})
	}
	if !b.Alive(context.Background(), info) {
		t.Fatal("session died")
	}
}

func TestExecContextCancelKillsCommand(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r := runCtx(ctx, t, b, info, backends.ExecRequest{Cmd: "echo started; sleep 71"})
	if r.err != context.DeadlineExceeded {
		t.Fatalf("err %v, want context.DeadlineExceeded", r.err)
	}
	if !r.status.TimedOut {
		t.Errorf("status %+v, want TimedOut", r.status)
	}
	if r.stdout != "started\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	if r.elapsed > 30*time.Second { // a hang, not a timing goal
		t.Errorf("took %v", r.elapsed)
	}
	waitNoProcesses(t, b, info, "sleep 71")

	// An already cancelled context runs nothing.
	r = runCtx(ctx, t, b, info, backends.ExecRequest{Cmd: "touch /workspace/should-not-exist"})
	if r.err == nil {
		t.Fatal("exec with a cancelled context succeeded")
	}
	if got := mustRun(t, b, info, "ls /workspace"); strings.Contains(got, "should-not-exist") {
		t.Fatal("command ran despite the cancelled context")
	}
}

// countingWriter counts bytes and records when the first byte arrived.
type countingWriter struct {
	n     atomic.Int64
	first chan struct{}
	once  sync.Once
}

func newCountingWriter() *countingWriter { return &countingWriter{first: make(chan struct{})} }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	c.once.Do(func() { close(c.first) })
	return len(p), nil
}

func TestExecStreamsLargeOutput(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	const size = 5 << 20
	out, errOut := newCountingWriter(), newCountingWriter()
	st, err := b.Exec(context.Background(), info, backends.ExecRequest{
		Cmd:     fmt.Sprintf("head -c %d /dev/zero; head -c %d /dev/urandom >&2", size, size/5),
		Timeout: time.Minute,
		Stdout:  out,
		Stderr:  errOut,
	})
	if err != nil || st.TimedOut || st.ExitCode != 0 {
		t.Fatalf("status %+v err %v", st, err)
	}
	if got := out.n.Load(); got != size {
		t.Errorf("stdout bytes %d, want %d", got, size)
	}
	if got := errOut.n.Load(); got != size/5 {
		t.Errorf("stderr bytes %d, want %d", got, size/5)
	}
}

func TestExecStreamsAsOutputArrives(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	out := newCountingWriter()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := b.Exec(context.Background(), info, backends.ExecRequest{
			Cmd: "echo first; sleep 3; echo second", Timeout: 30 * time.Second, Stdout: out,
		})
		done <- err
	}()
	select {
	case <-out.first:
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("first output arrived after %v", d)
		}
	case err := <-done:
		t.Fatalf("exec ended (%v) before any output was streamed", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no output within 10s")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out.n.Load() != int64(len("first\nsecond\n")) {
		t.Errorf("got %d bytes", out.n.Load())
	}
}

// failingWriter fails after the first write: Exec must stop the command and
// report it rather than run it blind.
type failingWriter struct{ writes atomic.Int32 }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.writes.Add(1) > 1 {
		return 0, io.ErrShortWrite
	}
	return len(p), nil
}

func TestExecWriterFailureStopsCommand(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	_, err := b.Exec(context.Background(), info, backends.ExecRequest{
		Cmd:     "while :; do echo tick; sleep 0.1; done & sleep 72",
		Timeout: 30 * time.Second,
		Stdout:  &failingWriter{},
	})
	if err == nil || !isKind(err, boxerr.ErrBox) {
		t.Fatalf("err %v, want a BoxError", err)
	}
	waitNoProcesses(t, b, info, "sleep 72")
}

func TestExecMemoryLimitKillsHog(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b, func(s *backends.SandboxSpec) { s.MemoryMB = 64 })
	// A 256 MiB string cannot fit in 64 MiB without swap. awk doubles it
	// in memory, without the pipe a shell variable is read through, which
	// on gVisor (every read a sentry syscall) took ~53 s of the minute.
	r := run(t, b, info, `awk 'BEGIN { s = "a"; for (i = 0; i < 28; i++) s = s s; print "survived", length(s) }'`, time.Minute)
	if onGVisor(t) {
		// gVisor's sentry holds the sandbox's memory and is what the
		// cgroup's OOM killer picks: the whole sandbox ends and the
		// command reads as killed (137). Through Engine execs the session
		// is then gone; through the agent its container was started again
		// (restarted) and the next command runs.
		agent := usesAgent(t)
		if r.err != nil || r.status.ExitCode != 137 || r.status.Restarted != agent || strings.Contains(r.stdout, "survived") {
			t.Fatalf("memory hog on gVisor: status %+v err %v stdout %q, want exit 137, restarted %v", r.status, r.err, r.stdout, agent)
		}
		got := run(t, b, info, "true", 30*time.Second)
		if agent && (got.err != nil || got.status.ExitCode != 0) || !agent && !isKind(got.err, boxerr.ErrSessionNotFound) {
			t.Fatalf("after the OOM: %+v", got)
		}
		return
	}
	if r.err != nil || r.status.TimedOut {
		t.Fatalf("status %+v err %v", r.status, r.err)
	}
	if r.status.ExitCode != 137 || strings.Contains(r.stdout, "survived") {
		t.Fatalf("memory hog not OOM-killed: exit %d stdout %q stderr %q", r.status.ExitCode, r.stdout, r.stderr)
	}
	if usesAgent(t) && !r.status.OOMKilled {
		t.Fatalf("the OOM kill is not reported (OOMKilled): %+v", r.status)
	}
	if got := mustRun(t, b, info, "echo still here"); got != "still here\n" {
		t.Fatalf("session unusable after OOM: %q", got)
	}
}

func TestExecForkBombIsContainedAndKilled(t *testing.T) {
	t.Parallel()
	b := newBackend(t, func(c *docker.Config) { c.CPULimitEnabled = true })
	info := startSession(t, b, func(s *backends.SandboxSpec) {
		s.PidsLimit = 64
		s.CPUs = 0.5
	})
	mustRun(t, b, info, "echo before > /workspace/f")
	// The bomb starts in a subshell so the foreground never forks after
	// it (it could fail with "can't fork" and end the exec early); exec
	// keeps the foreground alive without needing a pid of its own, so the
	// exec ends only by the timeout's kill.
	r := run(t, b, info, "bomb() { bomb | bomb & }; (bomb) & exec sleep 73", 3*time.Second)
	if onGVisor(t) {
		// gVisor's own threads share the container's pids cgroup: when
		// the bomb fills it, the sentry cannot start a thread and the
		// whole sandbox ends. Contained, but the session is gone, which
		// the runtime answers by recreating it; through the agent, the
		// agent is lost with it and the container restarted.
		// The exec may also fail to start (exit 128) when the bomb of an
		// earlier instant already holds every pid.
		t.Logf("fork bomb on gVisor: status %+v err %v after %v", r.status, r.err, r.elapsed)
		switch {
		case r.err != nil && !sandboxEnded(r.err):
			t.Fatalf("fork bomb: %v, want a timeout, BoxSessionNotFoundError or the sandbox restarted", r.err)
		case r.err == nil && !r.status.TimedOut && r.status.ExitCode != 128:
			t.Fatalf("fork bomb ended by itself (status %+v, stdout %q, stderr %q): want a timeout, exit 128 or the sandbox gone", r.status, r.stdout, r.stderr)
		}
		// Killing the bomb's tree means a helper exec in a sandbox whose
		// pids are exhausted: it takes seconds, and the sandbox may end.
		if r.elapsed > 60*time.Second {
			t.Errorf("the fork bomb held Exec for %v", r.elapsed)
		}
		// Contained: the sandbox is either gone (typed) or still serves.
		after := run(t, b, info, "echo after", 60*time.Second)
		if after.err != nil && !sandboxEnded(after.err) {
			t.Fatalf("after the fork bomb: %v, want the session working, BoxSessionNotFoundError or the sandbox restarted", after.err)
		}
		if after.err == nil && after.stdout != "after\n" {
			t.Errorf("after the fork bomb: status %+v stdout %q", after.status, after.stdout)
		}
		return
	} else if r.err != nil || !r.status.TimedOut {
		t.Fatalf("status %+v err %v, want a timeout", r.status, r.err)
	}
	// Not a timing goal (a loaded engine has taken 14 s to let the kill's
	// helper exec in past the exhausted pids): only a hang fails.
	t.Logf("fork bomb killed; Exec returned after %v", r.elapsed)
	if r.elapsed > 60*time.Second {
		t.Errorf("the fork bomb held Exec for %v", r.elapsed)
	}
	if got := mustRun(t, b, info, "cat /workspace/f"); got != "before\n" {
		t.Fatalf("after the fork bomb: %q", got)
	}
	waitNoProcesses(t, b, info, "bomb")
	waitNoProcesses(t, b, info, "sleep 73")
	out := mustRun(t, b, info, "ps -o pid | wc -l")
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); n > 10 {
		t.Errorf("%d processes left after killing the fork bomb", n)
	}
}

func TestExecReadOnlyRootfs(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	ro := startSession(t, b)
	rw := startSession(t, b, func(s *backends.SandboxSpec) { s.ReadOnlyRootfs = false; s.SessionID += "-rw" })

	tests := []struct {
		name   string
		info   backends.Session
		path   string
		writes bool
	}{
		{"ro: /etc", ro, "/etc/x", false},
		{"ro: /", ro, "/x", false},
		{"ro: home", ro, "/home/sandbox/x", false},
		{"ro: /var/tmp", ro, "/var/tmp/x", false},
		{"ro: workspace", ro, "/workspace/x", true},
		{"ro: tmp", ro, "/tmp/x", true},
		{"rw: home", rw, "/home/sandbox/x", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, b, tc.info, "echo data > "+tc.path, 30*time.Second)
			if r.err != nil || r.status.TimedOut {
				t.Fatalf("status %+v err %v", r.status, r.err)
			}
			// Podman gives a read-only rootfs writable tmpfs mounts on
			// /var/tmp and /run (its read-only-tmpfs default, which its
			// Docker API cannot turn off); they count against memory_mb.
			want := tc.writes || (tc.path == "/var/tmp/x" && onPodman(t))
			if wrote := r.status.ExitCode == 0; wrote != want {
				t.Fatalf("write to %s: exit %d (stderr %q), want success=%v", tc.path, r.status.ExitCode, r.stderr, want)
			}
		})
	}
	// boxrt's own pid files: a small tmpfs nobody runs anything from.
	// runc's kernel prints the size in KiB, gVisor as given.
	mounts := mustRun(t, b, ro, "grep ' /run/boxrt ' /proc/mounts")
	if !strings.Contains(mounts, "tmpfs") || !strings.Contains(mounts, "noexec") || !(strings.Contains(mounts, "size=1024k") || strings.Contains(mounts, "size=1m")) {
		t.Errorf("/run/boxrt is not a 1 MiB noexec tmpfs: %q", mounts)
	}
}

// TestExecNetwork: a session with network off has no way out; one with
// network on has only lo, a default route into it and the egress proxy
// behind it, which refuses the host's bridge address, the host's other
// addresses and the metadata range (the proxy's counters say so); under
// gVisor, whose netstack would bypass the proxy, network is refused.
func TestExecNetwork(t *testing.T) {
	t.Parallel()
	var proxy *egress.Proxy
	b := newBackend(t, func(c *docker.Config) { proxy = c.Egress })
	if onGVisor(t) {
		spec := backends.DefaultSandboxSpec()
		spec.SessionID, spec.Network = t.Name(), backends.NetworkOn
		_, err := b.StartSession(context.Background(), spec)
		if !errors.Is(err, boxerr.ErrValidation) {
			t.Fatalf("network on under gVisor: %v, want a BoxValidationError", err)
		}
		return
	}
	off := startSession(t, b)
	on := startSession(t, b, func(s *backends.SandboxSpec) { s.Network = backends.NetworkOn; s.SessionID += "-on" })
	for name, info := range map[string]backends.Session{"off": off, "on": on} {
		if ifaces := mustRun(t, b, info, "ls /sys/class/net"); strings.TrimSpace(ifaces) != "lo" {
			t.Errorf("network %s: interfaces %q, want only lo", name, ifaces)
		}
	}
	if route := mustRun(t, b, on, "awk '$2 == \"00000000\" {print $1}' /proc/net/route"); route != "lo\n" {
		t.Errorf("network on: default route %q, want into lo", route)
	}
	targets := []string{bridgeGateway(t, rawClient(t)), hostAddress(t), "169.254.169.254", "10.0.2.2"}
	for _, addr := range targets {
		cmd := fmt.Sprintf("nc -w 3 %s 80 </dev/null; echo done", addr)
		for name, info := range map[string]backends.Session{"off": off, "on": on} {
			r := run(t, b, info, cmd, 30*time.Second)
			if r.err != nil || r.status.TimedOut || r.stdout != "done\n" {
				t.Errorf("network %s: nc %s: %+v %v %q %q", name, addr, r.status, r.err, r.stdout, r.stderr)
			}
		}
	}
	es := proxy.Session(on.SessionID)
	if es == nil {
		t.Fatal("the session with network is not attached to the egress proxy")
	}
	// The proxy decides after the client went: wait for the last.
	deadline := time.Now().Add(10 * time.Second)
	for st := es.Stats(); len(st.Allowed) != 0 || len(st.Denied) != len(targets); st = es.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("egress counters %+v: want every target denied", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hostAddress is an IPv4 address of this host outside every bridge.
func hostAddress(t *testing.T) string {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || strings.HasPrefix(i.Name, "docker") ||
			strings.HasPrefix(i.Name, "boxrt") || strings.HasPrefix(i.Name, "br-") || strings.HasPrefix(i.Name, "veth") || strings.HasPrefix(i.Name, "cni") {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
				return p.Addr().String()
			}
		}
	}
	t.Fatal("this host has no IPv4 address outside its bridges")
	return ""
}

// bridgeGateway is the host's address on the default bridge network: the
// IPAM gateway when the engine reports one, else the first address of the
// bridge's subnet (what dockerd assigns to docker0 by default).
func bridgeGateway(t *testing.T, cli *client.Client) string {
	t.Helper()
	bridge, err := cli.NetworkInspect(context.Background(), "bridge", network.InspectOptions{})
	if err != nil || len(bridge.IPAM.Config) == 0 {
		t.Fatalf("cannot inspect the docker bridge network: %v %+v", err, bridge.IPAM)
	}
	cfg := bridge.IPAM.Config[0]
	if cfg.Gateway != "" {
		return cfg.Gateway
	}
	prefix, err := netip.ParsePrefix(cfg.Subnet)
	if err != nil {
		t.Fatalf("bridge subnet %q: %v", cfg.Subnet, err)
	}
	return prefix.Masked().Addr().Next().String()
}
