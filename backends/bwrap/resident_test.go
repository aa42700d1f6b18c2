package bwrap

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// serveCmd starts busybox httpd on 127.0.0.1:port serving dir (made with
// an index.html saying word) in the foreground of its shell: run it with
// & to leave it in the background.
func serveCmd(port int, dir, word string) string {
	return fmt.Sprintf("mkdir -p %s && echo %s > %s/index.html && busybox httpd -f -p 127.0.0.1:%d -h %s", dir, word, dir, port, dir)
}

// fetchCmd fetches the index page on port, retrying while the server
// starts.
func fetchCmd(port int) string {
	return fmt.Sprintf("for i in $(seq 50); do busybox wget -q -O - http://127.0.0.1:%d/ && exit 0; sleep 0.1; done; exit 1", port)
}

// TestBackgroundServerReachedByNextExec: what one command leaves running
// is there for the next, on the session's one loopback, with network off
// and on.
func TestBackgroundServerReachedByNextExec(t *testing.T) {
	for _, network := range []backends.NetworkMode{backends.NetworkOff, backends.NetworkOn} {
		t.Run(string(network), func(t *testing.T) {
			t.Parallel()
			b := newBackend(t)
			info := newSession(t, b, func(s *backends.SandboxSpec) { s.Network = network })
			r := execIn(t, b, info, backends.ExecRequest{Cmd: "(" + serveCmd(8765, "/tmp/www", "hello") + ") >/dev/null 2>&1 & echo started"})
			if r.err != nil || r.status.ExitCode != 0 || r.stdout != "started\n" {
				t.Fatalf("start server: %+v", r)
			}
			if got := mustRun(t, b, info, fetchCmd(8765)); got != "hello\n" {
				t.Fatalf("next exec fetched %q", got)
			}
			// Output a background process keeps open does not hold the
			// command that started it.
			r = execIn(t, b, info, backends.ExecRequest{Cmd: "sleep 300 & echo bg"})
			if r.err != nil || r.stdout != "bg\n" || r.elapsed > 5*time.Second {
				t.Fatalf("exec leaving a process on its stdout: %+v", r)
			}
		})
	}
}

// TestManagedProcessOnSessionLoopback: a managed process and the
// session's commands share one loopback (network off).
func TestManagedProcessOnSessionLoopback(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	mustRun(t, b, info, "mkdir -p /tmp/site && echo managed > /tmp/site/index.html")
	p, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{
		Command: "busybox", Args: []string{"httpd", "-f", "-p", "127.0.0.1:8766", "-h", "/tmp/site"},
	})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	if got := mustRun(t, b, info, fetchCmd(8766)); got != "managed\n" {
		t.Fatalf("exec fetched %q from the managed process", got)
	}
	if err := p.Signal(15); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if code, _ := p.Wait(); code != -15 {
		t.Fatalf("managed process ended with %d, want -15", code)
	}
}

// killAgent kills the session agent from inside the sandbox, found by its
// command line.
const killAgent = `for p in /proc/[0-9]*; do [ "$(tr '\0' '\n' < $p/cmdline 2>/dev/null | head -1)" = /run/boxrt-agent/boxrt ] && kill -9 ${p#/proc/}; done; sleep 5`

// TestAgentKilledFromInside: the sandbox is started again, the call (or
// the next) says restarted, files are kept and processes are not.
func TestAgentKilledFromInside(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	mustRun(t, b, info, "echo kept > /workspace/f; sleep 300.4242 >/dev/null 2>&1 &")
	r := execIn(t, b, info, backends.ExecRequest{Cmd: killAgent})
	if r.err != nil {
		t.Fatalf("exec killing the agent: %v", r.err)
	}
	t.Logf("the exec that killed its agent: %+v", r)
	if r.elapsed > 4*time.Second {
		t.Fatalf("the exec outlived its agent's death by %v", r.elapsed)
	}
	// The bracket keeps grep from finding itself.
	next := execIn(t, b, info, backends.ExecRequest{Cmd: "cat /workspace/f; grep -l '300[.]4242' /proc/[0-9]*/cmdline; true"})
	if next.err != nil || next.status.ExitCode != 0 {
		t.Fatalf("exec after the agent died: %+v", next)
	}
	if !r.status.Restarted && !next.status.Restarted {
		t.Fatalf("neither the killing call (%+v) nor the next (%+v) says restarted", r.status, next.status)
	}
	if next.stdout != "kept\n" {
		t.Fatalf("after restart: %q, want the file kept and the process gone", next.stdout)
	}
	if again := execIn(t, b, info, backends.ExecRequest{Cmd: "true"}); again.status.Restarted {
		t.Fatalf("a call in the running restarted sandbox says restarted: %+v", again.status)
	}
}

// TestTimeoutKeepsEarlierBackgroundProcess: a timeout kills the exec's
// own process tree, not what an earlier exec left running.
func TestTimeoutKeepsEarlierBackgroundProcess(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	mustRun(t, b, info, "sleep 300 >/dev/null 2>&1 & echo $! > /tmp/bg")
	r := execIn(t, b, info, backends.ExecRequest{Cmd: "sleep 200 & echo $! > /tmp/own; sleep 100", Timeout: time.Second})
	if r.err != nil || !r.status.TimedOut || r.status.Restarted {
		t.Fatalf("want a plain timeout, got %+v", r)
	}
	got := mustRun(t, b, info, "kill -0 $(cat /tmp/bg) && echo earlier; kill -0 $(cat /tmp/own) 2>/dev/null && echo own; true")
	if got != "earlier\n" {
		t.Fatalf("after the timeout: %q, want only the earlier process alive", got)
	}
}

// TestTimeoutKillsSetsidDescendants: a timeout kills what the command
// started in a session of its own (setsid leaves the process group), and
// the sandbox is not restarted for it.
func TestTimeoutKillsSetsidDescendants(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	own := mark("300.6")
	r := execIn(t, b, info, backends.ExecRequest{Cmd: "setsid sleep " + own + " >/dev/null 2>&1 & sleep 100", Timeout: time.Second})
	if r.err != nil || !r.status.TimedOut || r.status.Restarted {
		t.Fatalf("want a plain timeout, got %+v", r)
	}
	assertNoHostProcs(t, own)
}

// TestStuckAgentKilledFromHost: when the agent does not carry out a
// timeout's kill (here it is stopped), the host kills the sandbox, and
// the result says restarted.
func TestStuckAgentKilledFromHost(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	stop := strings.Replace(killAgent, "kill -9", "kill -STOP", 1)
	r := execIn(t, b, info, backends.ExecRequest{Cmd: stop + "; sleep 100", Timeout: time.Second})
	if r.err != nil || !r.status.TimedOut || !r.status.Restarted {
		t.Fatalf("want a timeout with restarted, got %+v", r)
	}
	if r.elapsed > time.Second+killGrace+2*time.Second {
		t.Fatalf("the host kill took %v", r.elapsed)
	}
	if next := execIn(t, b, info, backends.ExecRequest{Cmd: "echo ok"}); next.err != nil || next.stdout != "ok\n" {
		t.Fatalf("after the host kill: %+v", next)
	}
}

// TestTerminalInSandbox: a command on a terminal sees it under its own
// name in the sandbox's devpts, as on any machine.
func TestTerminalInSandbox(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	r := execIn(t, b, info, backends.ExecRequest{Cmd: "tty; stty size", TTY: &backends.TTYSize{Rows: 30, Cols: 100}})
	if r.err != nil || r.status.ExitCode != 0 || !strings.HasPrefix(r.stdout, "/dev/pts/") || !strings.HasSuffix(r.stdout, "\r\n30 100\r\n") {
		t.Fatalf("tty; stty size on a terminal: %+v", r)
	}
}

// TestPersistentSandboxOutlivesBackend: a persistent session's sandbox
// keeps running when its Backend goes (Close, as boxrt stopping), and a
// new Backend on the same state directory adopts it with its processes;
// a non-persistent session's processes end with the Backend.
func TestPersistentSandboxOutlivesBackend(t *testing.T) {
	t.Parallel()
	stateDir, instance := t.TempDir(), testInstanceID(t)
	b1 := newBackendAt(t, stateDir, instance)
	for _, network := range []backends.NetworkMode{backends.NetworkOff, backends.NetworkOn} {
		t.Run(string(network), func(t *testing.T) {
			spec := backends.DefaultSandboxSpec()
			spec.SessionID = "keep-" + string(network)
			spec.Persistent = true
			spec.Network = network
			info, err := b1.StartSession(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			mustRun(t, b1, info, "("+serveCmd(8767, "/tmp/www", "kept")+") >/dev/null 2>&1 &")
			mustRun(t, b1, info, fetchCmd(8767))
		})
	}
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := newBackendAt(t, stateDir, instance)
	adopted, err := b2.Adopt(context.Background())
	if err != nil || len(adopted) != 2 {
		t.Fatalf("Adopt: %v %v", adopted, err)
	}
	for _, info := range adopted {
		r := execIn(t, b2, info, backends.ExecRequest{Cmd: fetchCmd(8767)})
		if r.err != nil || r.stdout != "kept\n" || r.status.Restarted {
			t.Errorf("%s after the backend's restart: %+v", info.SessionID, r)
		}
		if info.Network == backends.NetworkOn && b2.cfg.Egress.Session(info.SessionID) == nil {
			// The proxy that served it went with the first backend.
			t.Errorf("%s: not attached to the new backend's egress proxy", info.SessionID)
		}
		if err := b2.StopSession(context.Background(), info); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUnadoptedSandboxStopped: a persistent session's sandbox left by an
// earlier Backend is killed when the session is stopped before any call
// took it over.
func TestUnadoptedSandboxStopped(t *testing.T) {
	t.Parallel()
	stateDir, instance := t.TempDir(), testInstanceID(t)
	b1 := newBackendAt(t, stateDir, instance)
	info := newSession(t, b1, func(s *backends.SandboxSpec) { s.Persistent = true })
	marker := mark("300.0433")
	mustRun(t, b1, info, "sleep "+marker+" >/dev/null 2>&1 &")
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	if len(hostProcsWith("sleep "+marker)) == 0 {
		t.Fatal("the persistent session's process did not outlive its backend")
	}
	b2 := newBackendAt(t, stateDir, instance)
	if _, err := b2.Adopt(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b2.StopSession(context.Background(), info); err != nil {
		t.Fatal(err)
	}
	assertNoHostProcs(t, "sleep "+marker)
}

// TestClaimedPersistentGetsPersistentSandbox: a pooled session's sandbox
// (which ends with boxrt) is replaced when a persistent session claims it.
func TestClaimedPersistentGetsPersistentSandbox(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	mustRun(t, b, info, "true")
	spec := backends.DefaultSandboxSpec()
	spec.SessionID = info.SessionID
	spec.Persistent = true
	claimed, err := b.Claim(context.Background(), info, spec)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, b, claimed, "true")
	res := &b.files(claimed.BackendSessionID).res
	res.mu.Lock()
	persist := res.persist
	res.mu.Unlock()
	if !persist {
		t.Fatal("the claimed persistent session runs in the pool's sandbox, which ends with boxrt")
	}
}

// TestSandboxMountsHoldOnlyItsStage: a sandbox's bwrap starts from a mount
// namespace that holds its own session's stage and none of the others', so
// its mount table does not grow with the number of sessions (mountns.go).
func TestSandboxMountsHoldOnlyItsStage(t *testing.T) {
	b := newBackend(t)
	var infos []backends.Session
	for i := range 6 {
		infos = append(infos, newSession(t, b, func(s *backends.SandboxSpec) {
			s.SessionID = fmt.Sprintf("%s-%d", t.Name(), i)
		}))
	}
	last := infos[len(infos)-1]
	mustRun(t, b, last, "true")
	sf := b.files(last.BackendSessionID)
	sf.res.mu.Lock()
	pid := sf.res.r.cmd.Process.Pid
	sf.res.mu.Unlock()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	own, others := 0, 0
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case sf.stage != "" && (strings.Contains(line, " "+sf.stage+"/") || strings.Contains(line, " "+sf.stage+" ")):
			own++
		case strings.Contains(line, " "+stageRoot+"/"):
			others++
		}
	}
	if sf.stage == "" {
		t.Fatal("no stage: this test needs root")
	}
	if own == 0 || others != 0 {
		t.Fatalf("bwrap's mount namespace holds %d mounts of its own stage and %d of other stages:\n%s", own, others, data)
	}
	host, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(host), " "+filepath.Join(stageRoot, b.cfg.InstanceID)+"/"); n < 2*len(infos) {
		t.Fatalf("boxrt's namespace holds %d stage mounts of %d sessions: the test did not stage what it meant to", n, len(infos))
	}
}

// TestStartBurst: many sessions started at once on this machine's cores
// all get their sandbox: starts beyond the bound wait their turn instead
// of sharing the CPU until they all miss acceptTimeout.
func TestStartBurst(t *testing.T) {
	b := newBackend(t)
	n := 4 * cap(b.starts)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			spec := backends.DefaultSandboxSpec()
			spec.SessionID = fmt.Sprintf("%s-%d", t.Name(), i)
			info, err := b.StartSession(context.Background(), spec)
			if err == nil {
				t.Cleanup(func() { _ = b.StopSession(context.Background(), info) })
				var out execResult
				if out = execIn(t, b, info, backends.ExecRequest{Cmd: "echo up"}); out.err != nil || out.stdout != "up\n" {
					err = fmt.Errorf("exec: %+v", out)
				}
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestRunningSandboxesHoldNoThread keeps a dozen sandboxes running: boxrt
// waits for each bwrap in the Go runtime's poller, so its threads do not
// grow with them (a goroutine blocked in wait(2) held one OS thread per
// running session, with its stacks).
func TestRunningSandboxesHoldNoThread(t *testing.T) {
	b := newBackend(t)
	newRunning := func(i int) {
		info := newSession(t, b, func(s *backends.SandboxSpec) {
			s.SessionID = fmt.Sprintf("%s-%d", t.Name(), i)
		})
		mustRun(t, b, info, "true")
	}
	newRunning(0) // the threads a start needs at all
	before := osThreads(t)
	const n = 12
	for i := 1; i <= n; i++ {
		newRunning(i)
	}
	if after := osThreads(t); after-before >= n/2 {
		t.Fatalf("%d more sandboxes running, %d more threads (%d → %d)", n, after-before, before, after)
	}
}

func osThreads(t *testing.T) int {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: in /proc/self/status")
	return 0
}
