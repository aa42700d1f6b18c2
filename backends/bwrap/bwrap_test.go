package bwrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestDescribeAndProbe(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	if b.Name() != "bwrap" || b.DefaultImage() != "host" {
		t.Fatalf("Name/DefaultImage = %q/%q", b.Name(), b.DefaultImage())
	}
	d := b.Describe()
	if d.Isolation != "namespaces (bubblewrap)" || !d.SkillsLive {
		t.Fatalf("Describe = %+v", d)
	}
	t.Logf("enforced limits: %v; notes: %q", d.EnforcedLimits, d.Notes)
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED the enforced-limit check: not root, cgroups are not ours to write")
	}
	for limit, ctrl := range controllerOf {
		if machineHasController(ctrl) && !slices.Contains(d.EnforcedLimits, limit) {
			t.Errorf("this machine has the %s controller but Describe says %s is not enforced: %v", ctrl, limit, d.EnforcedLimits)
		}
	}
}

func TestProbeMissingBwrap(t *testing.T) {
	t.Parallel()
	b, err := New(Config{InstanceID: "x", StateDir: t.TempDir(), BwrapPath: "/nonexistent/bwrap"})
	if err != nil {
		t.Fatal(err)
	}
	err = b.Probe(context.Background())
	if !errors.Is(err, boxerr.ErrBackendUnavailable) || !strings.Contains(err.Error(), "apt-get install bubblewrap") {
		t.Fatalf("Probe with a missing bwrap = %v; want BackendUnavailable naming the fix", err)
	}
	_, err = b.StartSession(context.Background(), func() backends.SandboxSpec { s := backends.DefaultSandboxSpec(); s.SessionID = "s"; return s }())
	if !errors.Is(err, boxerr.ErrBackendUnavailable) {
		t.Fatalf("StartSession with a missing bwrap = %v", err)
	}
}

func TestExecBasics(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	cases := []struct {
		name       string
		req        backends.ExecRequest
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"echo", backends.ExecRequest{Cmd: "echo hello"}, 0, "hello\n", ""},
		{"exit code", backends.ExecRequest{Cmd: "exit 3"}, 3, "", ""},
		{"stderr", backends.ExecRequest{Cmd: "echo oops >&2; exit 1"}, 1, "", "oops\n"},
		{"default workdir", backends.ExecRequest{Cmd: "pwd"}, 0, "/workspace\n", ""},
		{"workdir created", backends.ExecRequest{Cmd: "pwd", Workdir: "/workspace/a/b"}, 0, "/workspace/a/b\n", ""},
		{"workdir in tmp", backends.ExecRequest{Cmd: "pwd", Workdir: "/tmp/x"}, 0, "/tmp/x\n", ""},
		{"request env", backends.ExecRequest{Cmd: `printf '%s|%s' "$FOO" "$HOME"`, Env: map[string]string{"FOO": "a b=c"}}, 0, "a b=c|/home", ""},
		{"signal exit", backends.ExecRequest{Cmd: "kill -9 $$"}, 137, "", ""},
		// pid 1 is bwrap's init, 2 the session's agent.
		{"pid namespace", backends.ExecRequest{Cmd: "tr '\\0' '\\n' < /proc/2/cmdline | head -1"}, 0, agentBinPath + "\n", ""},
		{"hostname", backends.ExecRequest{Cmd: "cat /proc/sys/kernel/hostname"}, 0, "boxrt\n", ""},
		{"no capabilities", backends.ExecRequest{Cmd: "grep CapEff /proc/self/status"}, 0, "CapEff:\t0000000000000000\n", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := execIn(t, b, info, tc.req)
			if r.err != nil || r.status.TimedOut {
				t.Fatalf("err=%v status=%+v stderr=%q", r.err, r.status, r.stderr)
			}
			if r.status.ExitCode != tc.wantCode || r.stdout != tc.wantStdout || r.stderr != tc.wantStderr {
				t.Fatalf("got code=%d stdout=%q stderr=%q; want code=%d stdout=%q stderr=%q",
					r.status.ExitCode, r.stdout, r.stderr, tc.wantCode, tc.wantStdout, tc.wantStderr)
			}
		})
	}
}

func TestExecValidation(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	cases := []struct {
		name string
		info backends.Session
		req  backends.ExecRequest
		want error
	}{
		{"empty cmd", info, backends.ExecRequest{Cmd: "  "}, boxerr.ErrValidation},
		{"bad env", info, backends.ExecRequest{Cmd: "true", Env: map[string]string{"A=B": "x"}}, boxerr.ErrValidation},
		{"relative workdir", info, backends.ExecRequest{Cmd: "true", Workdir: "rel"}, boxerr.ErrValidation},
		{"unknown session", func() backends.Session { i := info; i.BackendSessionID = "nope-00000000"; return i }(), backends.ExecRequest{Cmd: "true"}, boxerr.ErrSessionNotFound},
		{"path traversal id", func() backends.Session { i := info; i.BackendSessionID = "../../etc"; return i }(), backends.ExecRequest{Cmd: "true"}, boxerr.ErrSessionNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Exec(context.Background(), tc.info, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Exec = %v; want %v", err, tc.want)
			}
		})
	}
}

func TestHostEnvNotVisible(t *testing.T) {
	t.Setenv("BOXRT_HOST_SECRET", "do-not-leak")
	b := newBackend(t)
	info := newSession(t, b, nil)
	out := mustRun(t, b, info, "env")
	if strings.Contains(out, "BOXRT_HOST_SECRET") || strings.Contains(out, "do-not-leak") {
		t.Fatalf("host environment leaked into the sandbox:\n%s", out)
	}
	for _, want := range []string{"PATH=" + defaultPath, "HOME=/home"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("sandbox env lacks %s:\n%s", want, out)
		}
	}
}

func TestFilesPersistAcrossExecs(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	mustRun(t, b, info, "echo persisted > /workspace/f.txt && echo tmp > /tmp/t && echo home > ~/h")
	if got := mustRun(t, b, info, "cat /workspace/f.txt /tmp/t /home/h"); got != "persisted\ntmp\nhome\n" {
		t.Fatalf("second exec read %q", got)
	}
	// and the file is where the session's state says it is
	data, err := os.ReadFile(filepath.Join(workspaceOnHost(b, info), "f.txt"))
	if err != nil || string(data) != "persisted\n" {
		t.Fatalf("host side of the workspace: %q, %v", data, err)
	}
}

func TestTimeoutKillsTreeKeepsSession(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	mustRun(t, b, info, "echo before > /workspace/before")
	marker := mark("60.0417")
	r := execIn(t, b, info, backends.ExecRequest{
		Cmd:     "echo started; sleep " + marker + " & sleep " + marker + "; echo never",
		Timeout: 2 * time.Second,
	})
	if r.err != nil || !r.status.TimedOut {
		t.Fatalf("want TimedOut, got err=%v status=%+v", r.err, r.status)
	}
	if r.elapsed > 3500*time.Millisecond {
		t.Fatalf("timeout of 2s took %v to return", r.elapsed)
	}
	if r.stdout != "started\n" {
		t.Fatalf("output before the timeout was lost: %q", r.stdout)
	}
	assertNoHostProcs(t, "sleep "+marker)
	if got := mustRun(t, b, info, "cat /workspace/before && echo after"); got != "before\nafter\n" {
		t.Fatalf("session after timeout: %q", got)
	}
}

func TestContextCancelKillsTree(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	marker := mark("60.0419")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	r := runCtx(ctx, t, b, info, backends.ExecRequest{Cmd: "sleep " + marker})
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("want ctx.Err(), got err=%v status=%+v", r.err, r.status)
	}
	if r.elapsed > 2*time.Second {
		t.Fatalf("cancellation took %v", r.elapsed)
	}
	assertNoHostProcs(t, "sleep "+marker)
	mustRun(t, b, info, "true")
}

// TestNetwork: network off has no way out; network on has a namespace of
// its own whose default route leads into its loopback, where the egress
// proxy takes every connection: the host's loopback (also through what was
// slirp's gateway), the host's own address and the metadata range are
// refused, and the server on the host's loopback never sees a connection.
func TestNetwork(t *testing.T) {
	t.Parallel()
	requireBwrap(t)
	srv := newBannerServer(t)
	port := portOf(srv.addr)
	hostNet, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t)
	cases := []struct {
		network backends.NetworkMode
		target  string
	}{
		{backends.NetworkOff, srv.addr},
		{backends.NetworkOn, srv.addr},           // the sandbox's own loopback
		{backends.NetworkOn, "10.0.2.2:" + port}, // slirp's gateway to the host, once
		{backends.NetworkOn, defaultRouteAddr(t) + ":" + port},
		{backends.NetworkOn, "169.254.169.254:" + port},
	}
	sessions := map[backends.NetworkMode]backends.Session{}
	for _, mode := range []backends.NetworkMode{backends.NetworkOff, backends.NetworkOn} {
		sessions[mode] = newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "net-" + string(mode); s.Network = mode })
		if got := mustRun(t, b, sessions[mode], "readlink /proc/self/ns/net"); strings.TrimSpace(got) == hostNet {
			t.Fatalf("network=%s shares the host's network namespace", mode)
		}
	}
	// The default route leads into lo; any resolver address is the proxy's.
	if got := mustRun(t, b, sessions[backends.NetworkOn], "awk '$2 == \"00000000\" {print $1}' /proc/net/route; cat /etc/resolv.conf"); got != "lo\n"+netResolvConf {
		t.Fatalf("network on: default route and resolv.conf %q", got)
	}
	for _, tc := range cases {
		t.Run(string(tc.network)+"/"+tc.target, func(t *testing.T) {
			host, port, _ := net.SplitHostPort(tc.target)
			r := execIn(t, b, sessions[tc.network], backends.ExecRequest{
				Cmd:     fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s && head -c 5 <&3'", host, port),
				Timeout: 20 * time.Second,
			})
			if r.err != nil || r.status.TimedOut {
				t.Fatalf("err=%v status=%+v", r.err, r.status)
			}
			if strings.Contains(r.stdout, bannerText) {
				t.Fatalf("network=%s reached %s: %q", tc.network, tc.target, r.stdout)
			}
		})
	}
	if n := srv.accepted.Load(); n != 0 {
		t.Fatalf("the server on the host's loopback saw %d connections", n)
	}
	es := b.cfg.Egress.Session(sessions[backends.NetworkOn].SessionID)
	if es == nil {
		t.Fatal("the network on session has no egress session")
	}
	if st := es.Stats(); len(st.Allowed) != 0 || len(st.Denied) < 3 {
		t.Fatalf("egress counters: %+v, want 3 denied destinations and none allowed", st)
	}
}

// TestNetworkSetupRetried: when the session's network cannot be set up
// (here on the first exec after the session's stage was dropped, as after
// a restart), that exec fails and the next one sets the network up
// afresh, rather than tripping over what the failed attempt left.
func TestNetworkSetupRetried(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.Network = backends.NetworkOn })
	if err := b.dropFiles(info.BackendSessionID); err != nil {
		t.Fatal(err)
	}
	unshare := b.unshare
	b.unshare = "/bin/false" // the namespace is never made
	r := execIn(t, b, info, backends.ExecRequest{Cmd: "true"})
	b.unshare = unshare
	if r.err == nil {
		t.Fatalf("exec without its network namespace succeeded: %+v", r.status)
	}
	if got := mustRun(t, b, info, "awk '$2 == \"00000000\" {print $1}' /proc/net/route"); got != "lo\n" {
		t.Fatalf("default route after the retried network setup: %q", got)
	}
}

// bannerText is what a bannerServer says first.
const bannerText = "hello"

// bannerServer listens on the host's loopback, greets each connection and
// counts them.
type bannerServer struct {
	addr     string
	accepted atomic.Int64
}

func newBannerServer(t *testing.T) *bannerServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &bannerServer{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			_, _ = c.Write([]byte(bannerText + "\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return s
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// defaultRouteAddr is the IPv4 address of the interface of this machine's
// default route: an address of the host that is not loopback.
func defaultRouteAddr(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/thread-self/net/route") // this thread's: a test that wedged the main thread in a namespace of its own moved /proc/net with it
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 2 || f[1] != "00000000" {
			continue
		}
		iface, err := net.InterfaceByName(f[0])
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	t.Fatal("this machine has no default route with an IPv4 address")
	return ""
}

func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	if !slices.Contains(b.Describe().EnforcedLimits, limitMemory) {
		if machineHasController("memory") && os.Geteuid() == 0 {
			t.Fatalf("this machine has the memory controller but Describe says memory is not enforced: %+v", b.Describe())
		}
		t.Skip("SKIPPED: no usable memory cgroup controller here, the limit is (correctly) reported as not enforced")
	}
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.MemoryMB = 64 })
	// tail must hold the whole newline-free stream in memory.
	r := execIn(t, b, info, backends.ExecRequest{Cmd: "head -c 300000000 /dev/zero | tail | wc -c"})
	if r.err != nil || r.status.TimedOut {
		t.Fatalf("err=%v status=%+v", r.err, r.status)
	}
	if !strings.Contains(r.stderr, "memory limit (64 MiB) killed") || strings.TrimSpace(r.stdout) != "0" {
		t.Fatalf("300 MB hog under a 64 MiB limit: code=%d stdout=%q stderr=%q", r.status.ExitCode, r.stdout, r.stderr)
	}
	r = execIn(t, b, info, backends.ExecRequest{Cmd: "head -c 300000000 /dev/zero | tail"})
	if r.status.ExitCode != 137 || !r.status.OOMKilled {
		t.Fatalf("hog exit code = %d, OOMKilled %v; want 137 (SIGKILL by the OOM killer), reported; stderr=%q", r.status.ExitCode, r.status.OOMKilled, r.stderr)
	}
	// below the limit is fine, and the session survives
	if r := execIn(t, b, info, backends.ExecRequest{Cmd: "true"}); r.status.OOMKilled {
		t.Fatalf("a command the limit killed nothing of reports OOMKilled")
	}
	if got := mustRun(t, b, info, "head -c 16000000 /dev/zero | tail | wc -c"); strings.TrimSpace(got) != "16000000" {
		t.Fatalf("16 MB under a 64 MiB limit: %q", got)
	}
}

func TestForkBombCapped(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	pidsEnforced := slices.Contains(b.Describe().EnforcedLimits, limitPids)
	if !pidsEnforced {
		if machineHasController("pids") && os.Geteuid() == 0 {
			t.Fatalf("this machine has the pids controller but Describe says pids is not enforced")
		}
		t.Skip("SKIPPED: the pids limit is not enforced here, and an uncapped fork bomb would hurt the host")
	}
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.PidsLimit = 32 })
	// dash refuses ":" as a function name, so the classic bomb runs in
	// bash; the sleep keeps the sandbox (and the bomb) alive until the
	// timeout kills it. It is forked first: once the bomb fills the pids
	// limit, the shell could not fork it any more.
	bomb := ":(){ :|:& };: # " + mark("") // the comment tells our bomb from another test run's
	done := make(chan execResult, 1)
	go func() {
		done <- execIn(t, b, info, backends.ExecRequest{Cmd: "sleep 30.0467 & bash -c '" + bomb + "'; wait", Timeout: 3 * time.Second})
	}()
	// Every process of the sandbox carries the bomb in its command line
	// (bwrap, its init, sh, the bash copies): sample how many exist.
	peak := 0
	var r execResult
sample:
	for {
		select {
		case r = <-done:
			break sample
		default:
		}
		peak = max(peak, len(hostProcsWith(bomb)))
		time.Sleep(50 * time.Millisecond)
	}
	if r.err != nil || !r.status.TimedOut {
		t.Fatalf("fork bomb exec: err=%v status=%+v stderr=%q", r.err, r.status, tail(r.stderr, 500))
	}
	if r.elapsed > 5*time.Second {
		t.Fatalf("fork bomb with a 3s timeout took %v", r.elapsed)
	}
	t.Logf("peak sandbox processes seen: %d", peak)
	if peak > 32+pidsOverhead {
		t.Fatalf("saw %d sandbox processes under a pids limit of 32 (+%d for bwrap)", peak, pidsOverhead)
	}
	if !strings.Contains(r.stderr, "process limit (32) refused") {
		t.Fatalf("the pids limit was never hit? stderr tail=%q", tail(r.stderr, 300))
	}
	assertNoHostProcs(t, bomb)
	if got := mustRun(t, b, info, "echo alive"); got != "alive\n" {
		t.Fatalf("session after fork bomb: %q", got)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func TestWritesConfined(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	extra := backendtest.ReachableDir(t)
	roDir := backendtest.ReachableDir(t)
	info := newSession(t, b, func(s *backends.SandboxSpec) {
		s.ExtraMounts = []backends.MountSpec{
			{HostPath: extra, MountPath: "/data", Mode: backends.MountRW},
			{HostPath: roDir, MountPath: "/workspace/ref", Mode: backends.MountRO},
		}
	})
	cases := []struct {
		path   string
		wantOK bool
	}{
		{"/workspace/ok", true},
		{"/tmp/ok", true},
		{"/home/ok", true},
		{"/data/ok", true},
		{"/workspace/ref/no", false},
		{"/no", false},
		{"/usr/no", false},
		{"/usr/local/no", false},
		{"/etc/no", false},
		{"/bin/no", false},
		{"/var/no", false},
		{"/proc/sys/kernel/hostname", false},
		{"/proc/sys/vm/drop_caches", false}, // a global sysctl: must never be writable
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			r := execIn(t, b, info, backends.ExecRequest{Cmd: "echo 1 > " + tc.path})
			if r.err != nil {
				t.Fatal(r.err)
			}
			if ok := r.status.ExitCode == 0; ok != tc.wantOK {
				t.Fatalf("write to %s ok=%v, want %v (stderr=%q)", tc.path, ok, tc.wantOK, r.stderr)
			}
		})
	}
	if data, err := os.ReadFile(filepath.Join(extra, "ok")); err != nil || string(data) != "1\n" {
		t.Fatalf("rw extra mount did not reach the host: %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(roDir, "no")); err == nil {
		t.Fatal("ro extra mount was written")
	}
}

// TestMountsChangePerExec: mounts come from the Session of each call,
// so a skill added to a running session is visible at the next exec
// (Describe's SkillsLive).
func TestMountsChangePerExec(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	skill := backendtest.ReachableDir(t)
	if err := os.WriteFile(filepath.Join(skill, "SKILL.md"), []byte("# demo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := execIn(t, b, info, backends.ExecRequest{Cmd: "cat /workspace/.skills/demo/SKILL.md"})
	if r.status.ExitCode == 0 {
		t.Fatal("skill visible before it was mounted")
	}
	withSkill := info
	withSkill.ExtraMounts = append(slices.Clone(info.ExtraMounts),
		backends.MountSpec{HostPath: skill, MountPath: "/workspace/.skills/demo", Mode: backends.MountRO})
	if got := mustRun(t, b, withSkill, "cat /workspace/.skills/demo/SKILL.md"); got != "# demo\n" {
		t.Fatalf("skill content %q", got)
	}
}

func TestHostPathWorkspace(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	host := filepath.Join(backendtest.ReachableDir(t), "proj") // created by StartSession
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.HostPath = host; s.MountPath = "/src" })
	mustRun(t, b, info, "mkdir -p deep && echo hi > deep/f")
	if data, err := os.ReadFile(filepath.Join(host, "deep", "f")); err != nil || string(data) != "hi\n" {
		t.Fatalf("host_path rw: %q %v", data, err)
	}
	ro := newSession(t, b, func(s *backends.SandboxSpec) {
		s.SessionID = "ro"
		s.HostPath = host
		s.HostPathMode = backends.MountRO
	})
	if got := mustRun(t, b, ro, "cat /workspace/deep/f; touch /workspace/x 2>/dev/null || echo refused"); got != "hi\nrefused\n" {
		t.Fatalf("host_path ro: %q", got)
	}
}

func TestLargeOutputStreams(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	const size = 5 << 20
	out, errb := &syncBuffer{}, &syncBuffer{}
	st, err := b.Exec(context.Background(), info, backends.ExecRequest{
		Cmd:     fmt.Sprintf("head -c %d /dev/urandom; head -c 1000 /dev/zero >&2", size),
		Timeout: 30 * time.Second, Stdout: out, Stderr: errb,
	})
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("err=%v status=%+v", err, st)
	}
	if out.Len() != size || errb.Len() != 1000 {
		t.Fatalf("stdout %d bytes (want %d), stderr %d bytes (want 1000)", out.Len(), size, errb.Len())
	}

	// Streaming: the first line arrives while the command still runs.
	out = newBuf()
	start := time.Now()
	st, err = b.Exec(context.Background(), info, backends.ExecRequest{
		Cmd: "echo first; sleep 2; echo second", Timeout: 10 * time.Second, Stdout: out,
	})
	if err != nil || st.ExitCode != 0 || out.String() != "first\nsecond\n" {
		t.Fatalf("err=%v status=%+v out=%q", err, st, out.String())
	}
	if d := out.first.Sub(start); d > 1500*time.Millisecond {
		t.Fatalf("first output reached the writer after %v: not streamed", d)
	}
}

func TestConcurrentExecs(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	s1 := newSession(t, b, nil)
	s2 := newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "other" })
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		info := s1
		if i%2 == 1 {
			info = s2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := newBuf()
			st, err := b.Exec(context.Background(), info, backends.ExecRequest{
				Cmd: fmt.Sprintf("echo %d > /workspace/f%d && cat /workspace/f%d", i, i, i), Timeout: 30 * time.Second, Stdout: out,
			})
			if err != nil || st.ExitCode != 0 || out.String() != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("exec %d: err=%v status=%+v out=%q", i, err, st, out.String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestStopSession(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	spec := backends.DefaultSandboxSpec()
	spec.SessionID = "stop me"
	info, err := b.StartSession(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(b.root, info.BackendSessionID)
	if !b.Alive(context.Background(), info) {
		t.Fatal("new session not alive")
	}
	mustRun(t, b, info, "echo x > /workspace/f")

	// A command still running is killed by StopSession.
	marker := mark("60.0423")
	done := make(chan execResult, 1)
	go func() { done <- execIn(t, b, info, backends.ExecRequest{Cmd: "sleep " + marker}) }()
	deadline := time.Now().Add(5 * time.Second)
	for len(hostProcsWith("sleep "+marker)) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.StopSession(context.Background(), info); err != nil {
		t.Fatalf("StopSession: %v", err)
	}
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatalf("exec killed by StopSession returned no error: %+v", r.status)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("exec did not return after StopSession")
	}
	assertNoHostProcs(t, "sleep "+marker)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state dir still there after StopSession: %v", err)
	}
	if b.Alive(context.Background(), info) {
		t.Fatal("stopped session still alive")
	}
	if _, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: "true"}); !errors.Is(err, boxerr.ErrSessionNotFound) {
		t.Fatalf("exec on a stopped session = %v, want SessionNotFound", err)
	}
	if err := b.StopSession(context.Background(), info); err != nil {
		t.Fatalf("second StopSession: %v", err)
	}
}

// TestStopSessionCancelled: a StopSession whose ctx ends while a command of
// the session is still going returns ctx's error and leaves the session
// usable — it is still there, and Alive says so — unless another
// StopSession is still removing it; a later StopSession removes it. The
// command is one still being set up (registered, bwrap not started yet),
// which a stop cannot kill, only wait for.
func TestStopSessionCancelled(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	cases := []struct {
		name string
		// otherStop: a StopSession without a deadline is under way too.
		otherStop bool
		// endFirst: the pending command ends before the next exec.
		endFirst bool
		wantExec error
	}{
		{name: "exec after the pending command ended", endFirst: true},
		{name: "exec while the pending command is still set up"},
		{name: "another stop still under way", otherStop: true, wantExec: boxerr.ErrSessionNotFound},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			info := newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = fmt.Sprintf("cancelled-stop-%d", i) })
			end := pendingExec(t, b, info)
			other := make(chan error, 1)
			if tc.otherStop {
				go func() { other <- b.StopSession(context.Background(), info) }()
				waitStopping(t, b, info)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := b.StopSession(ctx, info); !errors.Is(err, context.Canceled) {
				t.Fatalf("StopSession with an ended ctx = %v, want context.Canceled", err)
			}
			if tc.endFirst {
				end()
			}
			if !b.Alive(context.Background(), info) {
				t.Fatal("the session is gone after a cancelled StopSession")
			}
			r := execIn(t, b, info, backends.ExecRequest{Cmd: "echo ok"})
			if tc.wantExec != nil {
				if !errors.Is(r.err, tc.wantExec) {
					t.Fatalf("exec = %v (%+v), want %v", r.err, r.status, tc.wantExec)
				}
			} else if r.err != nil || r.status.ExitCode != 0 || r.stdout != "ok\n" {
				t.Fatalf("exec after a cancelled StopSession: err=%v status=%+v stdout=%q stderr=%q", r.err, r.status, r.stdout, r.stderr)
			}
			end()
			if tc.otherStop {
				select {
				case err := <-other:
					if err != nil {
						t.Fatalf("the other StopSession: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the other StopSession did not return once the pending command ended")
				}
				if b.Alive(context.Background(), info) {
					t.Fatal("the session survived the StopSession that was not cancelled")
				}
				return
			}
			if err := b.StopSession(context.Background(), info); err != nil {
				t.Fatalf("StopSession after a cancelled one: %v", err)
			}
			if b.Alive(context.Background(), info) {
				t.Fatal("the session survived the second StopSession")
			}
		})
	}
}

// pendingExec registers a run of the session as start does before bwrap
// exists, while it builds the sandbox. The returned func ends it as start
// does when it fails; it also runs at cleanup (before the session's stop).
func pendingExec(t *testing.T, b *Backend, info backends.Session) (end func()) {
	t.Helper()
	dir, _ := b.sessionDir(info)
	r := &run{b: b, key: info.BackendSessionID, done: make(chan struct{}), init: -1}
	if err := b.register(r, info.SessionID, dir); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end = func() {
		once.Do(func() {
			b.unregister(r)
			close(r.done)
		})
	}
	t.Cleanup(end)
	return end
}

// waitStopping waits until a StopSession of the session is under way.
func waitStopping(t *testing.T, b *Backend, info backends.Session) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		b.mu.Lock()
		sr := b.sessions[info.BackendSessionID]
		stopping := sr != nil && sr.stopping > 0
		b.mu.Unlock()
		if stopping {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("StopSession did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStartSessionAfterClose: a session started after Close (a request
// racing shutdown) still gets a working disk, and no disk image of the
// pool — its template above all — is made again to outlive the Backend.
func TestStartSessionAfterClose(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// before: sessions started before Close (the first makes the
		// template and starts the pool).
		before int
	}{
		{"closed before any session", 0},
		{"closed after a session", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t)
			for i := range tc.before {
				newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = fmt.Sprintf("before-%d", i) })
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			info := newSession(t, b, nil)
			if got := mustRun(t, b, info, "echo x > /workspace/f && cat /workspace/f"); got != "x\n" {
				t.Fatalf("workspace of a session started after Close: %q", got)
			}
			pool := filepath.Join(b.root, diskPoolDir)
			if left, err := filepath.Glob(filepath.Join(pool, "*", "*")); err != nil || len(left) > 0 {
				t.Fatalf("pool files made after Close: %v %v", left, err)
			}
			if _, err := os.Stat(pool); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("pool directory %s after Close: %v", pool, err)
			}
		})
	}
}

// TestCloseReleasesIdleCgroups: as boxrt closes, a persistent session
// whose sandbox runs keeps its cgroup for the next boxrt to adopt, and one
// whose sandbox does not run keeps none (a state directory deleted after
// would otherwise leave it for good); the next boxrt runs it again.
func TestCloseReleasesIdleCgroups(t *testing.T) {
	t.Parallel()
	requireBwrap(t)
	state, inst := t.TempDir(), testInstanceID(t)
	b := newBackendAt(t, state, inst)
	if b.cg.version == cgroupNone {
		t.Fatal("no usable cgroups: the test cannot see what Close keeps")
	}
	running := newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "running"; s.Persistent = true })
	idle := newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "idle"; s.Persistent = true })
	mustRun(t, b, running, "true")
	mustRun(t, b, idle, "echo kept > /workspace/f")
	b.files(idle.BackendSessionID).releaseIdle(0)
	if !released(b, idle) {
		t.Fatal("the idle session's sandbox was not released")
	}
	leafOf := func(info backends.Session) string {
		for _, l := range b.cg.leaves(inst) {
			if strings.HasPrefix(l, info.BackendSessionID+".") {
				return l
			}
		}
		return ""
	}
	if leafOf(running) == "" || leafOf(idle) == "" {
		t.Fatalf("leaves before Close: %v", b.cg.leaves(inst))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if leafOf(running) == "" || leafOf(idle) != "" {
		t.Fatalf("leaves after Close: %v; want the running session's alone", b.cg.leaves(inst))
	}
	next := newBackendAt(t, state, inst)
	if _, err := next.Adopt(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, next, idle, "cat /workspace/f"); got != "kept\n" {
		t.Fatalf("the idle session after a restart: %q", got)
	}
	for _, info := range []backends.Session{running, idle} {
		_ = next.StopSession(context.Background(), info)
	}
}

func TestAdopt(t *testing.T) {
	t.Parallel()
	requireBwrap(t)
	state := t.TempDir()
	ours := testInstanceID(t)
	b1 := newBackendAt(t, state, ours)
	other := newBackendAt(t, state, testInstanceID(t))

	mk := func(b *Backend, id string, mutate func(*backends.SandboxSpec)) backends.Session {
		spec := backends.DefaultSandboxSpec()
		spec.SessionID = id
		if mutate != nil {
			mutate(&spec)
		}
		info, err := b.StartSession(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	a := mk(b1, "a", nil)
	bb := mk(b1, "b", func(s *backends.SandboxSpec) {
		s.Network = backends.NetworkOn
		s.MemoryMB = 128
		s.Persistent = true
		s.ExtraMounts = []backends.MountSpec{{HostPath: backendtest.ReachableDir(t), MountPath: "/data", Mode: backends.MountRO}}
	})
	foreign := mk(other, "c", nil)
	defer func() {
		for _, i := range []backends.Session{a, bb} {
			_ = b1.StopSession(context.Background(), i)
		}
		_ = other.StopSession(context.Background(), foreign)
	}()
	mustRun(t, b1, bb, "echo kept > /workspace/k")
	// junk in our directory is ignored
	if err := os.MkdirAll(filepath.Join(b1.root, "junk-00000000"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b1.root, "junk-00000000", sessionFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A restarted boxrt of the same installation: the first one stops
	// (its persistent session's sandbox is left to the next).
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	restarted := newBackendAt(t, state, ours)
	got, err := restarted.Adopt(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("Adopt returned %d sessions, want our 2: %+v", len(got), got)
	}
	for i, want := range []backends.Session{a, bb} {
		g := got[i]
		if g.CreatedAt.IsZero() || g.LastUsedAt.IsZero() {
			t.Errorf("adopted %s lacks times: %+v", g.SessionID, g)
		}
		g.CreatedAt, g.LastUsedAt = time.Time{}, time.Time{}
		if fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", want) {
			t.Errorf("adopted session differs:\n got %+v\nwant %+v", g, want)
		}
	}
	if got := mustRun(t, restarted, got[1], "cat /workspace/k"); got != "kept\n" {
		t.Fatalf("exec in adopted session: %q", got)
	}
	// The restarted process owns the session now (its network included).
	if err := restarted.StopSession(context.Background(), got[1]); err != nil {
		t.Fatal(err)
	}
	if got, _ := other.Adopt(context.Background()); len(got) != 1 || got[0].SessionID != "c" {
		t.Fatalf("other installation adopted %+v", got)
	}
}

func TestStartSessionValidation(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	noShell := t.TempDir()
	cases := []struct {
		name   string
		mutate func(*backends.SandboxSpec)
	}{
		{"docker image name", func(s *backends.SandboxSpec) { s.Image = "python:3.12-slim" }},
		{"missing dir", func(s *backends.SandboxSpec) { s.Image = "/nonexistent/rootfs" }},
		{"host root", func(s *backends.SandboxSpec) { s.Image = "/" }},
		{"rootfs without sh", func(s *backends.SandboxSpec) { s.Image = noShell }},
		{"mount over proc", func(s *backends.SandboxSpec) { s.MountPath = "/proc/x" }},
		{"mount at root", func(s *backends.SandboxSpec) {
			s.ExtraMounts = []backends.MountSpec{{HostPath: backendtest.ReachableDir(t), MountPath: "/", Mode: backends.MountRO}}
		}},
		{"empty session id", func(s *backends.SandboxSpec) { s.SessionID = "" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := backends.DefaultSandboxSpec()
			spec.SessionID = "v"
			tc.mutate(&spec)
			_, err := b.StartSession(context.Background(), spec)
			if !errors.Is(err, boxerr.ErrValidation) {
				t.Fatalf("StartSession = %v, want a BoxValidationError", err)
			}
		})
	}
	if err := func() error {
		spec := backends.DefaultSandboxSpec()
		spec.SessionID = "v"
		spec.Image = "ubuntu"
		_, err := b.StartSession(context.Background(), spec)
		return err
	}(); err == nil || !strings.Contains(err.Error(), "bwrap images are rootfs directories") {
		t.Fatalf("image error does not explain bwrap images: %v", err)
	}
	entries, _ := os.ReadDir(b.root)
	if len(entries) != 0 {
		t.Fatalf("failed StartSession left state behind: %v", entries)
	}
}

// busyboxRootfs makes a tiny rootfs from the static busybox.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	src := "/bin/busybox"
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("a static busybox is needed for the rootfs test (apt-get install busybox-static): %v", err)
	}
	root := backendtest.ReachableDir(t)
	for _, d := range []string{"bin", "etc", "workspace"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "echo", "cat", "ls", "touch", "mkdir", "pwd", "env", "id"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "os-release"), []byte("ID=boxrt-test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestRootfsImage(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	rootfs := busyboxRootfs(t)
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.Image = rootfs })
	if info.Image != rootfs {
		t.Fatalf("session image = %q", info.Image)
	}
	got := mustRun(t, b, info, "cat /etc/os-release; echo hi > /workspace/f; cat /workspace/f; pwd; ls /usr 2>/dev/null || echo no-usr; touch /bin/x 2>/dev/null || echo ro")
	if got != "ID=boxrt-test\nhi\n/workspace\nno-usr\nro\n" {
		t.Fatalf("rootfs exec output %q", got)
	}
	// The image directory itself was not written to.
	if entries, _ := os.ReadDir(filepath.Join(rootfs, "workspace")); len(entries) != 0 {
		t.Fatalf("the image was modified: %v", entries)
	}
}

func TestManagedProcessCat(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	p, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{ProcessID: "default", Command: "cat"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(p.Stdin(), "hello mcp\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(p.Stdout(), buf, len("hello mcp\n"))
	if err != nil || string(buf[:n]) != "hello mcp\n" {
		t.Fatalf("round trip: %q %v", buf[:n], err)
	}
	if err := p.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	code, err := waitWithin(t, p, 5*time.Second)
	if err != nil || code != 0 {
		t.Fatalf("cat after stdin EOF: code=%d err=%v", code, err)
	}
	if rest, err := io.ReadAll(p.Stdout()); err != nil || len(rest) != 0 {
		t.Fatalf("stdout after exit: %q %v", rest, err)
	}
	if rest, err := io.ReadAll(p.Stderr()); err != nil || len(rest) != 0 {
		t.Fatalf("stderr: %q %v", rest, err)
	}
}

func waitWithin(t *testing.T, p backends.Process, d time.Duration) (int, error) {
	t.Helper()
	type res struct {
		code int
		err  error
	}
	ch := make(chan res, 1)
	go func() { c, err := p.Wait(); ch <- res{c, err} }()
	select {
	case r := <-ch:
		return r.code, r.err
	case <-time.After(d):
		_ = p.Signal(syscall.SIGKILL)
		r := <-ch
		t.Fatalf("process did not exit within %v (killed: code %d)", d, r.code)
		return 0, nil
	}
}

func TestManagedProcessSignalKillsTree(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	marker := mark("100.0431")
	cases := []struct {
		name      string
		sig       syscall.Signal
		immediate bool // signal right after start, before the command may exist
	}{
		{"SIGTERM", syscall.SIGTERM, false},
		{"SIGKILL", syscall.SIGKILL, false},
		{"SIGTERM at once", syscall.SIGTERM, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{
				Command: "sh", Args: []string{"-c", "sleep " + marker + " & sleep " + marker},
			})
			if err != nil {
				t.Fatal(err)
			}
			// bwrap's and sh's command lines hold the marker too: wait for
			// the two sleeps themselves.
			sleeps := func() int {
				n := 0
				for _, p := range hostProcsWith("sleep " + marker) {
					if _, cmd, _ := strings.Cut(p, ": "); strings.HasPrefix(cmd, "sleep ") {
						n++
					}
				}
				return n
			}
			deadline := time.Now().Add(5 * time.Second)
			for !tc.immediate && sleeps() < 2 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if n := sleeps(); n < 2 && !tc.immediate {
				t.Fatalf("expected the two sleeps to run, found %d", n)
			}
			if err := p.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			code, err := waitWithin(t, p, 5*time.Second)
			if err != nil || code != -int(tc.sig) {
				t.Fatalf("Wait after %v = %d, %v; want %d", tc.sig, code, err, -int(tc.sig))
			}
			assertNoHostProcs(t, "sleep "+marker)
			_, _ = io.ReadAll(p.Stdout())
			_, _ = io.ReadAll(p.Stderr())
			_ = p.Stdin().Close()
		})
	}
}

func TestManagedProcessEnvCwdAndStop(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	p, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{
		Command: "sh", Args: []string{"-c", `echo "$TOKEN $(pwd)"; echo to-stderr >&2; exec sleep ` + mark("60.0437")},
		Env: map[string]string{"TOKEN": "t0k"}, Cwd: "/workspace/srv", MemoryMB: 64,
	})
	if err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 64)
	n, err := io.ReadAtLeast(p.Stdout(), line, len("t0k /workspace/srv\n"))
	if err != nil || string(line[:n]) != "t0k /workspace/srv\n" {
		t.Fatalf("stdout %q %v", line[:n], err)
	}
	n, err = io.ReadAtLeast(p.Stderr(), line, len("to-stderr\n"))
	if err != nil || string(line[:n]) != "to-stderr\n" {
		t.Fatalf("stderr %q %v", line[:n], err)
	}
	// StopSession takes managed processes down too.
	if err := b.StopSession(context.Background(), info); err != nil {
		t.Fatal(err)
	}
	if code, err := waitWithin(t, p, 5*time.Second); err != nil || code != -9 {
		t.Fatalf("Wait after StopSession = %d, %v", code, err)
	}
	assertNoHostProcs(t, "sleep "+mark("60.0437"))
	_ = p.Stdin().Close()
	_, _ = io.ReadAll(p.Stdout())
	_, _ = io.ReadAll(p.Stderr())
}
