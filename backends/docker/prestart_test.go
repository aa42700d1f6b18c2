package docker_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestPrestartExec checks that the next plain exec runs in the exec started
// ahead of it (the command's shell is that exec's process: it execs in
// place), with its arguments intact, and that anything else leaves it and
// still works.
func TestPrestartExec(t *testing.T) {
	needEngine(t)
	b := newBackend(t, engineExecs)
	info := startSession(t, b)
	ctx := context.Background()

	scenarios := []struct {
		name string
		// before runs between the prestart and the exec (pid: the
		// prestarted exec's process).
		before  func(t *testing.T, pid string)
		req     backends.ExecRequest
		usesPid bool   // the command runs as the prestarted process
		want    string // stdout after the first line (the command's $$)
		code    int
		timeout bool
	}{
		{name: "a plain exec runs in it, its command as written",
			req:     backends.ExecRequest{Cmd: "echo $$\nprintf '%s|%s\\n' \"it's\" '$HOME'\nexit 3"},
			usesPid: true, want: "it's|$HOME\n", code: 3},
		{name: "an exec with environment starts its own and ends it",
			req:  backends.ExecRequest{Cmd: "echo $$; echo \"$X\"", Env: map[string]string{"X": "from env"}},
			want: "from env\n"},
		{name: "one that was killed is not used",
			before: func(t *testing.T, pid string) {
				rawExec(t, info.BackendSessionID, "kill -9 "+pid)
				waitNoRunningExecs(t, info)
			},
			req: backends.ExecRequest{Cmd: "echo $$; echo ok"}, want: "ok\n"},
		{name: "a command that overruns its timeout in it is killed",
			req:     backends.ExecRequest{Cmd: "echo $$; sleep 60", Timeout: time.Second},
			usesPid: true, timeout: true},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			if err := b.PrestartExec(ctx, info); err != nil {
				t.Fatalf("PrestartExec: %v", err)
			}
			pid := prestartedPid(t, info)
			if sc.before != nil {
				sc.before(t, pid)
			}
			r := runCtx(ctx, t, b, info, sc.req)
			if r.err != nil || r.status.TimedOut != sc.timeout || (!sc.timeout && r.status.ExitCode != sc.code) {
				t.Fatalf("exec: status %+v err %v, want exit %d timed out %v\nstdout: %s\nstderr: %s", r.status, r.err, sc.code, sc.timeout, r.stdout, r.stderr)
			}
			ran, out, _ := strings.Cut(r.stdout, "\n")
			if (ran == pid) != sc.usesPid || out != sc.want {
				t.Fatalf("command ran as pid %s (prestarted: %s, want it used: %v), output %q, want %q", ran, pid, sc.usesPid, out, sc.want)
			}
			waitPidGone(t, info, pid)
			waitNoProcesses(t, b, info, "sleep 60")
		})
	}
}

// TestPlainExecPrestartsTheNext checks that a plain exec starts the exec
// its session's next plain one runs in, that other execs neither use one
// nor start one, and that a session deleted while one starts leaves
// nothing behind (the backend's Close waits for it: goleak would see it).
func TestPlainExecPrestartsTheNext(t *testing.T) {
	needEngine(t)
	b := newBackend(t, engineExecs)
	info := startSession(t, b)
	ctx := context.Background()

	mustRun(t, b, info, "true")
	pid := prestartedPid(t, info)
	if ran := strings.TrimSpace(mustRun(t, b, info, "echo $$")); ran != pid {
		t.Fatalf("the next plain exec ran as pid %s, not in the one prestarted for it (%s)", ran, pid)
	}
	next := prestartedPid(t, info)
	if next == pid {
		t.Fatal("no new exec was prestarted after the last one was used")
	}

	r := runCtx(ctx, t, b, info, backends.ExecRequest{Cmd: "echo $$", Env: map[string]string{"X": "1"}, Timeout: 30 * time.Second})
	if r.err != nil || r.status.ExitCode != 0 || strings.TrimSpace(r.stdout) == next {
		t.Fatalf("an exec with environment: status %+v err %v stdout %q (prestarted: %s, must not be used)", r.status, r.err, r.stdout, next)
	}
	waitPidGone(t, info, next)
	time.Sleep(500 * time.Millisecond)
	if left := strings.Fields(rawExec(t, info.BackendSessionID, backendtest.ListPrestarted)); len(left) != 0 {
		t.Fatalf("an exec with environment prestarted one: %v", left)
	}

	mustRun(t, b, info, "true") // starts the next one; the delete races it
	if err := b.StopSession(ctx, info); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := rawClient(t).ContainerInspect(ctx, info.BackendSessionID); err == nil {
		t.Fatal("the session's container is still there")
	}
}

// TestPrestartExecEndsWithBackend checks that an unused prestarted exec
// ends when its backend closes (boxrt's exit): nothing is left running.
func TestPrestartExecEndsWithBackend(t *testing.T) {
	needEngine(t)
	info := startSession(t, newBackend(t, engineExecs))
	b := newBackend(t, engineExecs)
	if err := b.PrestartExec(context.Background(), info); err != nil {
		t.Fatal(err)
	}
	pid := prestartedPid(t, info)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitPidGone(t, info, pid)
}

// prestartedPid finds the process of the session's prestarted exec.
func prestartedPid(t *testing.T, info backends.Session) string {
	t.Helper()

	for i := 0; i < 50; i++ {
		found := strings.Fields(rawExec(t, info.BackendSessionID, backendtest.ListPrestarted))
		if len(found) == 1 {
			return found[0]
		}
		if len(found) > 1 {
			t.Fatalf("more than one prestarted exec: %v", found)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no prestarted exec is running")
	return ""
}

// waitPidGone waits for a process (and its zombie) to be gone.
func waitPidGone(t *testing.T, info backends.Session, pid string) {
	t.Helper()
	for i := 0; i < 50; i++ {
		if rawExec(t, info.BackendSessionID, "[ -e /proc/"+pid+" ] && echo here; true") == "" {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("process %s still there", pid)
}

// waitNoRunningExecs waits for the engine to report every exec of the
// session's container ended: gVisor's exits reach dockerd a moment after
// the process is gone, and until then the engine reports it running.
func waitNoRunningExecs(t *testing.T, info backends.Session) {
	t.Helper()
	ctx := context.Background()
	cli := rawClient(t)
	for i := 0; i < 100; i++ {
		c, err := cli.ContainerInspect(ctx, info.BackendSessionID)
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, id := range c.ExecIDs {
			if ins, err := cli.ContainerExecInspect(ctx, id); err == nil && ins.Running {
				running++
			}
		}
		if running == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the engine still reports a running exec")
}

// rawExec runs a script in the container through the Engine API, beside
// the backend (whose Exec would take the prestarted exec), and returns its
// stdout; a failure fails the test.
func rawExec(t *testing.T, containerName, script string) string {
	t.Helper()
	ctx := context.Background()
	cli := rawClient(t)
	created, err := cli.ContainerExecCreate(ctx, containerName, container.ExecOptions{
		AttachStdout: true, AttachStderr: true, Cmd: []string{"sh", "-c", script},
	})
	if err != nil {
		t.Fatal(err)
	}
	hj, err := cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer hj.Close()
	var out, errOut bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &errOut, hj.Reader); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		ins, err := cli.ContainerExecInspect(ctx, created.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !ins.Running {
			if ins.ExitCode != 0 {
				t.Fatalf("%q: exit %d: %s", script, ins.ExitCode, errOut.String())
			}
			return out.String()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%q did not end", script)
	return ""
}
