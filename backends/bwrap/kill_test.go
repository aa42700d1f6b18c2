package bwrap

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
)

// TestKillSandboxesThenStop: KillSandboxes ends everything the sessions
// run at once — their agents and what commands left running — without
// StopSession; StopSession then removes them, mounts stacked on a stage
// entry and mounted below one included, leaving nothing.
func TestKillSandboxesThenStop(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	marker := "sleep " + mark("900.0437") // a duration that names this test run
	var infos []backends.Session
	for _, name := range []string{"a", "b"} {
		info := newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "killsb-" + name })
		mustRun(t, b, info, marker+" >/dev/null 2>&1 &")
		infos = append(infos, info)
	}
	if len(hostProcsWith(marker)) != 2 {
		t.Fatalf("background processes: %v", hostProcsWith(marker))
	}
	b.KillSandboxes(context.Background(), infos)
	assertNoHostProcs(t, marker)

	stage := filepath.Join(stageRoot, b.cfg.InstanceID, infos[0].BackendSessionID)
	if b.id.cred != nil {
		extra := filepath.Join(stage, "extra")
		if err := os.Mkdir(extra, 0o700); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := unix.Mount("tmpfs", extra, "tmpfs", 0, ""); err != nil {
				t.Fatal(err)
			}
		}
		below := filepath.Join(stage, fsDir, "below")
		if err := os.Mkdir(below, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", below, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, info := range infos {
		if err := b.StopSession(context.Background(), info); err != nil {
			t.Fatal(err)
		}
		dir, _ := b.sessionDir(info)
		if _, err := os.Stat(dir); err == nil {
			t.Fatal("session directory left behind")
		}
		stage := filepath.Join(stageRoot, b.cfg.InstanceID, info.BackendSessionID)
		if _, err := os.Stat(stage); err == nil {
			t.Fatal("stage directory left behind")
		}
		for _, m := range mountPoints(t) {
			if strings.HasPrefix(m, dir) || strings.HasPrefix(m, stage) {
				t.Fatalf("mount left behind: %s", m)
			}
		}
	}
}

// TestKillSandboxesUnadopted: a persistent session's sandbox an earlier
// boxrt left running, adopted but not used since, is killed by
// KillSandboxes too.
func TestKillSandboxesUnadopted(t *testing.T) {
	t.Parallel()
	stateDir, instance := t.TempDir(), testInstanceID(t)
	b1 := newBackendAt(t, stateDir, instance)
	info := newSession(t, b1, func(s *backends.SandboxSpec) { s.Persistent = true })
	marker := "sleep " + mark("900.0439")
	mustRun(t, b1, info, marker+" >/dev/null 2>&1 &")
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	if len(hostProcsWith(marker)) == 0 {
		t.Fatal("the persistent session's process did not outlive its backend")
	}
	b2 := newBackendAt(t, stateDir, instance)
	if _, err := b2.Adopt(context.Background()); err != nil {
		t.Fatal(err)
	}
	b2.KillSandboxes(context.Background(), []backends.Session{info})
	assertNoHostProcs(t, marker)
	if err := b2.StopSession(context.Background(), info); err != nil {
		t.Fatal(err)
	}
}
