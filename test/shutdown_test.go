package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShutdownManySessionsFast: boxrt holding many bwrap sessions exits
// on stdin EOF within a few seconds (a host or a service manager gives
// an exiting child little more) and leaves nothing of them: no process,
// no mount, no cgroup, no session directory. Destroyed one after another,
// as they were, 120 sessions took 11 s here.
func TestShutdownManySessionsFast(t *testing.T) {
	const sessions = 120
	const bound = 4 * time.Second
	state := t.TempDir()
	p := Start(t, Options{Stdio: true, StateDir: state,
		Config: fmt.Sprintf(`{"backend":"bwrap","limits":{"max_sessions":%d}}`, sessions+8)})
	id, err := os.ReadFile(filepath.Join(state, "instance-id"))
	require.NoError(t, err)
	instance := strings.TrimSpace(string(id))

	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r := p.Call("box_exec", map[string]any{"session_id": fmt.Sprintf("s%d", i), "cmd": "echo up"}, 2*time.Minute)
				assert.Nil(t, r.Error, "session s%d", i)
			}
		}()
	}
	for i := range sessions {
		next <- i
	}
	close(next)
	wg.Wait()
	require.False(t, t.Failed())
	require.NotEmpty(t, sandboxProcs(instance), "the sessions' sandboxes run")

	start := time.Now()
	p.CloseStdin()
	code, exited := p.Wait(30 * time.Second)
	elapsed := time.Since(start)
	require.True(t, exited, "boxrt still runs 30 s after stdin EOF")
	assert.Zero(t, code)
	t.Logf("%d sessions: exit took %v", sessions, elapsed)
	assert.Less(t, elapsed, bound, "exit with %d sessions", sessions)

	assert.Empty(t, sandboxProcs(instance), "processes of the sessions left")
	assert.Empty(t, mountsBelow(filepath.Join("/run/boxrt/bwrap", instance)), "mounts left")
	leaves, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/boxrt", instance, "*", "cgroup.procs"))
	assert.Empty(t, leaves, "cgroups left")
	dirs, _ := os.ReadDir(filepath.Join(state, "bwrap", instance))
	var left []string
	for _, d := range dirs {
		if d.IsDir() {
			left = append(left, d.Name())
		}
	}
	assert.Empty(t, left, "session directories left")
}

// sandboxProcs lists the pids in the cgroups of a bwrap instance.
func sandboxProcs(instance string) []string {
	marker := "/boxrt/" + instance + "/"
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	var out []string
	for _, f := range procs {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), marker) {
			out = append(out, filepath.Base(filepath.Dir(f)))
		}
	}
	return out
}
