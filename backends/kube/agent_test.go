package kube_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// lockedBuffer is an output the test reads while the command runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAgentCommands: the session agent in the Pod serves the session's
// commands over one bridge exec: a background server one command starts
// is reached by the next, output streams while the command runs, stdin
// and a terminal work, and a timeout kills the command's tree.
func TestAgentCommands(t *testing.T) {
	b := newBackend(t, "")
	info := start(t, b, spec("agent-"+randomID()))
	b.WaitAgent(info.BackendSessionID)
	// Through the agent, a command has no pid file (an exec's is in
	// /run/boxrt while it runs).
	if got := mustRun(t, b, info, "ls -A /run/boxrt | grep -c '^.boxrt-exec-' || true"); got != "0" {
		t.Fatalf("the command ran as an exec of its own (%s pid files)", got)
	}

	mustRun(t, b, info, "echo kept > /workspace/f; (while :; do nc -l -p 7070 -e cat; done) >/dev/null 2>&1 &")
	if got := mustRun(t, b, info, "sleep 0.5; echo ping | nc -w 2 127.0.0.1 7070"); got != "ping" {
		t.Errorf("the background server answered %q", got)
	}

	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := b.Exec(ctx, info, backends.ExecRequest{Cmd: "echo first; sleep 3; echo second", Stdout: &out})
		done <- err
	}()
	deadline := time.Now().Add(2500 * time.Millisecond)
	for !strings.Contains(out.String(), "first") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := out.String(); got != "first\n" {
		t.Errorf("output while the command runs: %q, want the first line only", got)
	}
	if err := <-done; err != nil || out.String() != "first\nsecond\n" {
		t.Errorf("streamed exec: %v, output %q", err, out.String())
	}

	r, err := run(t, b, info, backends.ExecRequest{Cmd: "tr a-z A-Z", Stdin: io.NopCloser(strings.NewReader("hello\n"))})
	if err != nil || r.stdout != "HELLO\n" {
		t.Errorf("stdin: %v, stdout %q", err, r.stdout)
	}

	r, err = run(t, b, info, backends.ExecRequest{Cmd: "stty size; test -t 0 && echo tty", TTY: &backends.TTYSize{Rows: 33, Cols: 111}})
	if err != nil || !strings.Contains(r.stdout, "33 111") || !strings.Contains(r.stdout, "tty") {
		t.Errorf("terminal: %v, stdout %q", err, r.stdout)
	}

	r, err = run(t, b, info, backends.ExecRequest{Cmd: "sleep 888 & sleep 889", Timeout: 2 * time.Second})
	if err != nil || !r.TimedOut {
		t.Errorf("timeout: %v, status %+v", err, r.ExitStatus)
	}
	if left := mustRun(t, b, info, "ps -o args | grep -c '^sleep 88[89]' || true"); left != "0" {
		t.Errorf("%s processes of the timed-out command are left", left)
	}
	if got := mustRun(t, b, info, "cat /workspace/f"); got != "kept" {
		t.Errorf("file: %q", got)
	}
}

// TestAgentKilled: when the agent dies, the command under it fails with an
// error about the agent; the next command runs in the restarted container
// (files kept, processes gone) and says restarted.
func TestAgentKilled(t *testing.T) {
	b := newBackend(t, "")
	info := start(t, b, spec("agentkill-"+randomID()))
	b.WaitAgent(info.BackendSessionID)
	mustRun(t, b, info, "echo kept > /workspace/f; sleep 777 >/dev/null 2>&1 &")
	// The agent is the one boxrt binary with --listen (the bridge has
	// --bridge).
	kill := `for p in /proc/[0-9]*; do [ "$(readlink $p/exe)" = /run/boxrt-agent/boxrt ] && grep -q -- --listen $p/cmdline && kill -9 ${p#/proc/}; done; sleep 10`
	r, err := run(t, b, info, backends.ExecRequest{Cmd: kill})
	if err == nil || !strings.Contains(err.Error(), "agent") {
		t.Fatalf("killing the agent: status %+v err %v; want an error about the agent", r.ExitStatus, err)
	}
	r, err = run(t, b, info, backends.ExecRequest{Cmd: "cat /workspace/f; ps -o args | grep -c '^sleep 777' || true"})
	if err != nil || !r.Restarted || r.stdout != "kept\n0\n" {
		t.Fatalf("next exec: status %+v err %v stdout %q; want the file, no sleep, restarted", r.ExitStatus, err, r.stdout)
	}
	r, err = run(t, b, info, backends.ExecRequest{Cmd: "echo fine"})
	if err != nil || r.Restarted || r.stdout != "fine\n" {
		t.Errorf("the exec after: status %+v err %v stdout %q", r.ExitStatus, err, r.stdout)
	}
}

// TestAgentStoppedUnderTimeout: a command that stops the agent (SIGSTOP:
// it neither answers nor dies) still ends at its timeout. The agent does
// not kill it, so boxrt kills every process of the sandbox user through
// an exec of its own: the result says timed out and restarted, the next
// command runs in the restarted container (files kept, the command's
// processes gone) and does not say restarted again.
func TestAgentStoppedUnderTimeout(t *testing.T) {
	b := newBackend(t, "")
	info := start(t, b, spec("agentstop-"+randomID()))
	b.WaitAgent(info.BackendSessionID)
	mustRun(t, b, info, "echo kept > /workspace/f")
	stop := `for p in /proc/[0-9]*; do [ "$(readlink $p/exe)" = /run/boxrt-agent/boxrt ] && grep -q -- --listen $p/cmdline && kill -STOP ${p#/proc/}; done; sleep 778`
	start := time.Now()
	r, err := run(t, b, info, backends.ExecRequest{Cmd: stop, Timeout: 2 * time.Second})
	if err != nil || !r.TimedOut || !r.Restarted {
		t.Fatalf("stopping the agent: status %+v err %v after %v; want timed out and restarted", r.ExitStatus, err, time.Since(start))
	}
	r, err = run(t, b, info, backends.ExecRequest{Cmd: "cat /workspace/f; ps -o args | grep -c '^sleep 778' || true"})
	if err != nil || r.Restarted || r.stdout != "kept\n0\n" {
		t.Fatalf("next exec: status %+v err %v stdout %q; want the file, no sleep, restarted said once", r.ExitStatus, err, r.stdout)
	}
}

// TestAgentSuspendResume: the resumed Pod is a new one, with a new agent
// the same backend reaches (no restart to report: resuming is its own).
func TestAgentSuspendResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b := newBackend(t, "")
	s := spec("agentsusp-" + randomID())
	s.Persistent = true
	info := start(t, b, s)
	mustRun(t, b, info, "echo kept > /workspace/f")
	if err := b.Suspend(ctx, info); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	if err := b.Resume(ctx, info); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	b.WaitAgent(info.BackendSessionID)
	r, err := run(t, b, info, backends.ExecRequest{Cmd: "cat /workspace/f"})
	if err != nil || r.Restarted || r.stdout != "kept\n" {
		t.Errorf("exec after resume: status %+v err %v stdout %q", r.ExitStatus, err, r.stdout)
	}
}
