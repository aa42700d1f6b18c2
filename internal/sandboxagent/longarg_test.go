package sandboxagent

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"testing"
)

// longScript is a command line over a frame: an argument the agent gets
// through arg frames, whole.
func longScript(n int) string {
	return "printf '%s' " + strings.Repeat("a", n) + " | wc -c"
}

func TestSpawnLongArgument(t *testing.T) {
	s := newSession(t, t.TempDir())
	for _, n := range []int{maxFrame, 100_000, maxLongArg - 100} {
		outR, outW := pipe(t)
		p := spawn(t, s.c, SpawnRequest{Argv: sh(longScript(n)), Env: testEnv, Stdout: outW})
		outW.Close()
		out, _ := io.ReadAll(outR)
		if e := wait(t, p); e != (Exit{}) || strings.TrimSpace(string(out)) != strconv.Itoa(n) {
			t.Errorf("%d bytes: exit %+v, output %q", n, e, out)
		}
	}
	// Over the kernel's limit for one argument: refused on the host,
	// before anything is sent; the connection goes on.
	_, err := s.c.Spawn(t.Context(), SpawnRequest{Argv: sh(strings.Repeat("a", maxLongArg+1)), Env: testEnv, Stdout: nil})
	if err == nil || !strings.Contains(err.Error(), "over the kernel's") {
		t.Fatalf("an argument over MAX_ARG_STRLEN: %v", err)
	}
	outR, outW := pipe(t)
	p := spawn(t, s.c, SpawnRequest{Argv: sh("echo still"), Env: testEnv, Stdout: outW})
	outW.Close()
	if out, _ := io.ReadAll(outR); wait(t, p) != (Exit{}) || string(out) != "still\n" {
		t.Fatalf("after a refused spawn: %q", out)
	}
}

func TestRunLongArgument(t *testing.T) {
	sock, _ := streamAgent(t)
	c, _ := bridgeTo(t, sock)
	var out bytes.Buffer
	p := runProc(t, c, RunRequest{Argv: sh(longScript(100_000)), Stdout: &out})
	if e := wait(t, p); e != (Exit{}) || strings.TrimSpace(out.String()) != "100000" {
		t.Fatalf("exit %+v, output %q", e, out.String())
	}
}
