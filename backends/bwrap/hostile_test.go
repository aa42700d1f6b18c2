package bwrap

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// hostileMark is the workspace file that turns the test binary, started
// as a session's agent, into a hostile one; its content says how.
const hostileMark = "/workspace/.hostile"

// testAgent is the test binary run as a session agent: the real one, or,
// when the session's workspace holds hostileMark, one that dials and
// then misbehaves: "garbage" (a first frame that is no JSON), "huge" (a
// frame header of 1 GiB) or "fd" (a valid hello, then a frame carrying a
// descriptor).
func testAgent(args []string) int {
	mode, err := os.ReadFile(hostileMark)
	if err != nil {
		return sandboxagent.Main(args)
	}
	c, err := net.Dial("unix", args[len(args)-1])
	if err != nil {
		return 1
	}
	frame := func(payload string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
	}
	hello := `{"op":"hello","version":1,"pid":2}`
	switch strings.TrimSpace(string(mode)) {
	case "garbage":
		_, _ = c.Write(frame("{not json"))
	case "huge":
		_, _ = c.Write(binary.BigEndian.AppendUint32(nil, 1<<30))
	case "fd":
		_, _ = c.Write(frame(hello))
		_, _, _ = c.(*net.UnixConn).WriteMsgUnix(frame(`{"op":"started","id":1,"pid":5}`), unix.UnixRights(0), nil)
	}
	time.Sleep(time.Hour) // holds the connection until the sandbox is killed
	return 0
}

// TestHostileAgent: an agent that answers garbage, a huge frame or a
// descriptor makes the call fail with a typed error in bounded time, and
// the backend keeps serving its other sessions.
func TestHostileAgent(t *testing.T) {
	t.Parallel()
	requireBwrap(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{InstanceID: testInstanceID(t), StateDir: t.TempDir(), AgentBinary: self})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	good := newSession(t, b, nil)
	mustRun(t, b, good, "sleep 300 >/dev/null 2>&1 & echo started")
	for _, mode := range []string{"garbage", "huge", "fd"} {
		t.Run(mode, func(t *testing.T) {
			info := newSession(t, b, nil)
			if err := os.WriteFile(filepath.Join(workspaceOnHost(b, info), ".hostile"), []byte(mode), 0o644); err != nil {
				t.Fatal(err)
			}
			// The session's sandbox started with the real agent; the
			// next one starts with the hostile one.
			execIn(t, b, info, backends.ExecRequest{Cmd: killAgent})
			start := time.Now()
			_, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: "true", Timeout: time.Minute})
			if err == nil || boxerr.TypeOf(err) == "" {
				t.Fatalf("exec with a %s agent: %v, want a typed error", mode, err)
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Fatalf("exec with a %s agent took %v", mode, d)
			}
			t.Logf("%s: %v after %v", mode, err, time.Since(start))
			if got := mustRun(t, b, good, "echo ok; pgrep -c sleep"); got != "ok\n1\n" {
				t.Fatalf("the other session after a %s agent: %q", mode, got)
			}
		})
	}
}
