package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func spec(id string) Spec {
	s := DefaultSpec()
	s.SessionID = id
	s.Workdir = s.MountPath
	return s
}

func TestSessionReuseAndConflict(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Spec)
		field  string
	}{
		{"network", func(s *Spec) { s.Network = backends.NetworkOn }, "network"},
		{"image", func(s *Spec) { s.Image = "other:1" }, "image"},
		{"mount_path", func(s *Spec) { s.MountPath = "/w"; s.Workdir = "/w" }, "mount_path"},
		{"persistent", func(s *Spec) { s.Persistent = true }, "persistent"},
		{"cpus", func(s *Spec) { s.CPUs = 2 }, "cpus"},
		{"memory_mb", func(s *Spec) { s.MemoryMB = 256 }, "memory_mb"},
		{"pids_limit", func(s *Spec) { s.PidsLimit = 10 }, "pids_limit"},
		{"read_only_rootfs", func(s *Spec) { s.ReadOnlyRootfs = false }, "read_only_rootfs"},
		{"first differing field wins", func(s *Spec) { s.MemoryMB = 256; s.Network = backends.NetworkOn }, "network"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFake()
			rt, _ := newTestRuntime(t, fb, "")
			ctx := context.Background()
			first, err := rt.EnsureSession(ctx, spec("s1"))
			require.NoError(t, err)
			again, err := rt.EnsureSession(ctx, spec("s1"))
			require.NoError(t, err)
			assert.Equal(t, first.BackendSessionID, again.BackendSessionID, "compatible spec reuses the session")

			s := spec("s1")
			tc.change(&s)
			_, err = rt.EnsureSession(ctx, s)
			require.ErrorIs(t, err, boxerr.ErrSessionConflict)
			var be *boxerr.Error
			require.True(t, errors.As(err, &be))
			assert.Equal(t, tc.field, be.Details["field"])
			assert.Contains(t, be.Msg, tc.field+"=")
		})
	}
}

func TestSessionRecreated(t *testing.T) {
	ctx := context.Background()
	t.Run("extra mount set change recreates", func(t *testing.T) {
		fb := newFake()
		root := t.TempDir()
		rt, _ := newTestRuntime(t, fb, `{"local":{"allowed_mount_roots":["`+root+`"]}}`)
		a, err := rt.EnsureSession(ctx, spec("s"))
		require.NoError(t, err)
		s := spec("s")
		s.ExtraMounts = []backends.MountSpec{{HostPath: root, MountPath: "/data", Mode: backends.MountRO}}
		b, err := rt.EnsureSession(ctx, s)
		require.NoError(t, err)
		assert.NotEqual(t, a.BackendSessionID, b.BackendSessionID)
		assert.Equal(t, []string{a.BackendSessionID}, fb.stopped)
		// Same set in another order and with duplicates: reused.
		s.ExtraMounts = append(s.ExtraMounts, s.ExtraMounts[0])
		c, err := rt.EnsureSession(ctx, s)
		require.NoError(t, err)
		assert.Equal(t, b.BackendSessionID, c.BackendSessionID)
	})
	t.Run("dead sandbox recreated", func(t *testing.T) {
		fb := newFake()
		rt, _ := newTestRuntime(t, fb, "")
		a, err := rt.EnsureSession(ctx, spec("s"))
		require.NoError(t, err)
		fb.mu.Lock()
		fb.dead[a.BackendSessionID] = true
		fb.mu.Unlock()
		b, err := rt.EnsureSession(ctx, spec("s"))
		require.NoError(t, err)
		assert.NotEqual(t, a.BackendSessionID, b.BackendSessionID)
		assert.Equal(t, int64(1), rt.Status().TotalRecreated)
	})
	t.Run("exec on a dead sandbox recreates and runs once more", func(t *testing.T) {
		fb := newFake()
		rt, _ := newTestRuntime(t, fb, "")
		a, err := rt.EnsureSession(ctx, spec("s"))
		require.NoError(t, err)
		fb.mu.Lock()
		fb.dead[a.BackendSessionID] = true
		fb.mu.Unlock()
		s := spec("s")
		s.Cmd = "echo again"
		res, err := rt.Execs().Exec(ctx, s)
		require.NoError(t, err)
		assert.Equal(t, "echo again", res.Stdout)
		assert.Equal(t, 2, fb.started, "one sandbox replaced the dead one")
		assert.Equal(t, []string{a.BackendSessionID}, fb.stopped)
	})
}

func TestCapacity(t *testing.T) {
	fb := newFake()
	rt, _ := newTestRuntime(t, fb, `{"limits":{"max_sessions":2}}`)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, err := rt.EnsureSession(ctx, spec(id))
		require.NoError(t, err)
	}
	_, err := rt.EnsureSession(ctx, spec("c"))
	require.ErrorIs(t, err, boxerr.ErrCapacityExceeded)
	var be *boxerr.Error
	require.True(t, errors.As(err, &be))
	assert.Equal(t, "max_sessions", be.Details["limit"])
	// Reusing an existing id is not a new session.
	_, err = rt.EnsureSession(ctx, spec("a"))
	require.NoError(t, err)
}

func TestHostPathAllowList(t *testing.T) {
	fb := newFake()
	root := t.TempDir()
	rt, _ := newTestRuntime(t, fb, `{"local":{"allowed_mount_roots":["`+root+`"]}}`)
	ctx := context.Background()
	for name, path := range map[string]string{"outside": t.TempDir(), "root": "/", "system": "/etc", "socket": "/var/run/docker.sock"} {
		t.Run(name, func(t *testing.T) {
			s := spec("hp")
			s.HostPath = path
			_, err := rt.EnsureSession(ctx, s)
			require.ErrorIs(t, err, boxerr.ErrValidation)
		})
	}
}

func TestReaper(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	rt, clock := newTestRuntime(t, fb, `{"limits":{"session_ttl_sec":60}}`)
	for _, id := range []string{"idle", "persistent", "busy", "process"} {
		s := spec(id)
		s.Persistent = id == "persistent"
		_, err := rt.EnsureSession(ctx, s)
		require.NoError(t, err)
	}
	_, err := rt.Processes().Start(ctx, "process", backends.ProcessSpec{Command: "cat"})
	require.NoError(t, err)

	release := make(chan struct{})
	started := make(chan struct{})
	fb.execFn = func(ctx context.Context, _ backends.Session, _ backends.ExecRequest) (backends.ExitStatus, error) {
		close(started)
		<-release
		return backends.ExitStatus{}, nil
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s := spec("busy")
		s.Cmd = "sleep"
		_, err := rt.Execs().Exec(ctx, s)
		assert.NoError(t, err)
	}()
	<-started

	clock.Advance(59 * time.Second)
	assert.Equal(t, 0, rt.Reap(ctx), "nothing is older than the TTL yet")
	clock.Advance(2 * time.Second)
	assert.Equal(t, 1, rt.Reap(ctx), "only the idle session goes")
	ids := map[string]bool{}
	for _, s := range rt.ListSessions(context.Background()) {
		ids[s.SessionID] = true
	}
	assert.Equal(t, map[string]bool{"persistent": true, "busy": true, "process": true}, ids)

	close(release)
	wg.Wait()
	require.NoError(t, rt.Processes().Stop(ctx, "process", ""))
	clock.Advance(61 * time.Second)
	assert.Equal(t, 2, rt.Reap(ctx), "busy and process sessions go once idle")
	assert.Equal(t, int64(3), rt.Status().TotalReaped)
}

func TestReaperInterval(t *testing.T) {
	assert.Equal(t, 30*time.Second, reaperInterval(300*time.Second))
	assert.Equal(t, 5*time.Second, reaperInterval(5*time.Second))
	assert.Equal(t, time.Duration(0), reaperInterval(0))
}

func TestExecSerialisedPerSession(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	rt, _ := newTestRuntime(t, fb, "")
	fb.execFn = func(ctx context.Context, _ backends.Session, _ backends.ExecRequest) (backends.ExitStatus, error) {
		time.Sleep(20 * time.Millisecond)
		return backends.ExitStatus{ExitCode: 3}, nil
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := spec([]string{"a", "b"}[i%2])
			s.Cmd = "x"
			res, err := rt.Execs().Exec(ctx, s)
			assert.NoError(t, err)
			assert.Equal(t, 3, *res.ExitCode)
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, fb.maxPar["a"], "execs on one session never overlap")
	assert.Equal(t, 1, fb.maxPar["b"])
}

func TestExecResult(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	rt, _ := newTestRuntime(t, fb, "")
	fb.execFn = func(ctx context.Context, _ backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
		_, _ = req.Stdout.Write(make([]byte, 5000))
		return backends.ExitStatus{TimedOut: true}, nil
	}
	s := spec("t")
	s.Cmd = "sleep 60"
	s.MaxOutputBytes = 1024
	res, err := rt.Execs().Exec(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, StatusTimedOut, res.Status)
	assert.Nil(t, res.ExitCode)
	assert.True(t, res.StdoutTruncated)
	assert.Equal(t, int64(5000), res.StdoutBytes)
	assert.Equal(t, "Command timed out after 30 seconds.", res.Stderr)
	assert.Len(t, rt.ListSessions(context.Background()), 1, "a timeout keeps the session")

	s.Cmd = ""
	_, err = rt.Execs().Exec(ctx, s)
	require.ErrorIs(t, err, boxerr.ErrValidation)
}

func TestDeleteStopsProcesses(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	rt, _ := newTestRuntime(t, fb, "")
	_, err := rt.EnsureSession(ctx, spec("d"))
	require.NoError(t, err)
	_, err = rt.Processes().Start(ctx, "d", backends.ProcessSpec{Command: "cat", Env: map[string]string{"SECRET": "x"}})
	require.NoError(t, err)
	info, err := rt.Processes().Get(context.Background(), "d", "")
	require.NoError(t, err)
	assert.Equal(t, ProcessRunning, info.Status)
	assert.Equal(t, []string{"SECRET"}, info.EnvKeys)
	require.NoError(t, rt.DeleteSession(ctx, "d"))
	_, err = rt.Processes().Get(context.Background(), "d", "")
	require.ErrorIs(t, err, boxerr.ErrSessionNotFound)
	require.ErrorIs(t, rt.DeleteSession(ctx, "d"), boxerr.ErrSessionNotFound)
}

func TestConfigMergeAtomic(t *testing.T) {
	cfg := DefaultConfig()
	next, ignored, err := cfg.Merge([]byte(`{"limits":{"max_sessions":5},"local":{"allowed_mount_roots":"/a, /b","profile":"x"},"enabled":true,"admission":{"required":false}}`), json.Unmarshal)
	require.NoError(t, err)
	assert.Equal(t, []string{"admission", "enabled", "local.profile"}, ignored, "host-only keys are ignored and reported")
	assert.Equal(t, 5, next.Limits.MaxSessions)
	assert.Equal(t, 64, next.Limits.MaxManagedProcesses, "merge keeps keys not named")
	assert.Equal(t, StringList{"/a", "/b"}, next.Local.AllowedMountRoots)

	tests := []struct{ name, patch, field string }{
		{"out of range", `{"limits":{"max_sessions":5001}}`, "limits.max_sessions"},
		{"null section then bad value", `{"limits":null,"docker":{"user":"a b"}}`, "docker.user"},
		{"bad backend", `{"backend":"vm"}`, "backend"},
		{"negative idle release", `{"bwrap":{"idle_release_sec":-1}}`, "bwrap.idle_release_sec"},
		{"valid and invalid together", `{"limits":{"max_sessions":1,"session_ttl_sec":-1}}`, "limits.session_ttl_sec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := next.Merge([]byte(tc.patch), json.Unmarshal)
			require.ErrorIs(t, err, boxerr.ErrValidation)
			var be *boxerr.Error
			require.True(t, errors.As(err, &be))
			assert.Equal(t, tc.field, be.Details["field"])
			assert.Equal(t, next, got, "an invalid patch changes nothing")
		})
	}
}

type fakeSkills map[string]string

func (f fakeSkills) PackageRoot(_ context.Context, name string) (string, error) {
	if root, ok := f[name]; ok {
		return root, nil
	}
	return "", boxerr.Validation("skill_name", "skill %s not found", name)
}

func TestSkillMounts(t *testing.T) {
	ctx := context.Background()
	store := fakeSkills{"alpha": "/store/alpha", "beta": "/store/beta"}
	alpha := backends.MountSpec{HostPath: "/store/alpha", MountPath: "/workspace/.skills/alpha", Mode: backends.MountRO}
	betaRW := backends.MountSpec{HostPath: "/store/beta", MountPath: "/workspace/.skills/beta", Mode: backends.MountRW}
	run := func(rt *Runtime, skillName string, skills ...SkillMount) error {
		s := spec("sk")
		s.Cmd = "ls"
		s.SkillName = skillName
		s.Skills = skills
		_, err := rt.Execs().Exec(ctx, s)
		return err
	}

	t.Run("backend that cannot add mounts recreates once per new skill", func(t *testing.T) {
		fb := newFake()
		rt, _ := newTestRuntime(t, fb, "", WithSkillResolver(store))
		require.NoError(t, run(rt, "alpha"))
		require.Len(t, fb.specs, 1)
		assert.Equal(t, []backends.MountSpec{alpha}, fb.specs[0].ExtraMounts, "skill_name mounts read-only")
		require.NoError(t, run(rt, ""))
		require.NoError(t, run(rt, "alpha"))
		assert.Len(t, fb.specs, 1, "no new skill, no new sandbox")
		require.NoError(t, run(rt, "", SkillMount{Name: "beta", Mode: backends.MountRW}))
		require.Len(t, fb.specs, 2)
		assert.Equal(t, []backends.MountSpec{alpha, betaRW}, fb.specs[1].ExtraMounts, "recreated with the union")
		info, err := rt.GetSession(context.Background(), "sk")
		require.NoError(t, err)
		assert.Empty(t, info.ExtraMounts, "skill mounts are not the caller's extra mounts")
	})
	t.Run("live backend gets mounts per exec without recreating", func(t *testing.T) {
		fb := newFake()
		fb.live = true
		rt, _ := newTestRuntime(t, fb, "", WithSkillResolver(store))
		require.NoError(t, run(rt, "alpha"))
		require.NoError(t, run(rt, "", SkillMount{Name: "beta", Mode: backends.MountRW}))
		require.NoError(t, run(rt, ""))
		assert.Len(t, fb.specs, 1)
		assert.Empty(t, fb.specs[0].ExtraMounts)
		require.Len(t, fb.execInfo, 3)
		assert.Equal(t, []backends.MountSpec{alpha}, fb.execInfo[0].ExtraMounts)
		assert.Equal(t, []backends.MountSpec{alpha, betaRW}, fb.execInfo[1].ExtraMounts)
		assert.Equal(t, []backends.MountSpec{alpha, betaRW}, fb.execInfo[2].ExtraMounts, "skills stay with the session")
	})
	t.Run("unknown skill is a validation error", func(t *testing.T) {
		fb := newFake()
		rt, _ := newTestRuntime(t, fb, "", WithSkillResolver(store))
		require.ErrorIs(t, run(rt, "gamma"), boxerr.ErrValidation)
	})
	t.Run("no store", func(t *testing.T) {
		rt, _ := newTestRuntime(t, newFake(), "")
		require.ErrorIs(t, run(rt, "alpha"), boxerr.ErrValidation)
	})
}

// Two sandboxes of one session id (the first one's stop failed before a
// recreate) come back on adoption: one is served, the other stopped, not
// left running untracked.
func TestAdoptStopsDuplicateSandboxes(t *testing.T) {
	fb := newFake()
	first := backends.DefaultSandboxSpec()
	first.SessionID = "s1"
	fb.adopt = []backends.Session{first.Session("fake", "box-old"), first.Session("fake", "box-new")}
	rt, _ := newTestRuntime(t, fb, "")
	_, err := rt.backends.ensure(context.Background())
	require.NoError(t, err)
	sessions := rt.ListSessions(context.Background())
	require.Len(t, sessions, 1)
	assert.Equal(t, "box-old", sessions[0].BackendSessionID)
	fb.mu.Lock()
	defer fb.mu.Unlock()
	assert.Equal(t, []string{"box-new"}, fb.stopped)
}

// sharedFake is a backend whose sessions another process may use: it
// reports a last use the runtime did not see.
type sharedFake struct {
	*fakeBackend
	mu   sync.Mutex
	last time.Time
}

func (s *sharedFake) LastUsed(context.Context, backends.Session) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, nil
}

// TestReaperAsksSharedBackend: a session another replica used recently is
// not reaped; once nobody used it for the TTL, it is.
func TestReaperAsksSharedBackend(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	sf := &sharedFake{fakeBackend: fb}
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg, _, err := DefaultConfig().Merge([]byte(`{"limits":{"session_ttl_sec":60}}`), json.Unmarshal)
	require.NoError(t, err)
	rt, err := New(cfg, func(string, Config, string, string) (backends.Backend, error) { return sf, nil }, t.TempDir(), WithClock(clock))
	require.NoError(t, err)
	rt.Start(ctx)
	t.Cleanup(func() { _ = rt.Close(ctx) })
	_, err = rt.EnsureSession(ctx, spec("shared"))
	require.NoError(t, err)

	clock.Advance(61 * time.Second)
	sf.mu.Lock()
	sf.last = clock.Now().Add(-10 * time.Second) // used by another replica
	sf.mu.Unlock()
	assert.Equal(t, 0, rt.Reap(ctx), "used elsewhere 10 s ago: kept")
	clock.Advance(55 * time.Second)
	assert.Equal(t, 1, rt.Reap(ctx), "idle everywhere for the TTL: reaped")
}

// TestIsolationLevel: a spec asking for gVisor gets it only from a backend
// that offers it; elsewhere it is a validation error on isolation and no
// sandbox is started, so a session is never silently weaker than asked.
func TestIsolationLevel(t *testing.T) {
	tests := []struct {
		name    string
		levels  []string
		level   string
		wantErr bool
	}{
		{"default on any backend", nil, backends.IsolationDefault, false},
		{"gvisor not offered", nil, backends.IsolationGVisor, true},
		{"gvisor offered", []string{backends.IsolationGVisor}, backends.IsolationGVisor, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFake()
			fb.levels = tc.levels
			rt, _ := newTestRuntime(t, fb, "")
			s := spec("iso")
			s.Isolation = tc.level
			info, err := rt.EnsureSession(context.Background(), s)
			if tc.wantErr {
				require.ErrorIs(t, err, boxerr.ErrValidation)
				assert.Contains(t, err.Error(), "isolation")
				assert.Zero(t, fb.started, "no sandbox started")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.level, info.Isolation)
			assert.Equal(t, tc.level, fb.specs[0].Isolation, "the backend got the level")
		})
	}
	t.Run("unknown level", func(t *testing.T) {
		s := DefaultSpec()
		s.SessionID, s.Isolation = "x", "kata"
		err := s.Normalize()
		require.ErrorIs(t, err, boxerr.ErrValidation)
		assert.Contains(t, err.Error(), "isolation")
	})
}

// TestSkillStoreRoot: the skill store lives in the state directory unless
// host_root or an absolute skills_root places it, and a merged patch keeps
// the state directory.
func TestSkillStoreRoot(t *testing.T) {
	cfg := DefaultConfig().WithStateDir("/var/lib/boxrt")
	assert.Equal(t, "/var/lib/boxrt/skills", cfg.SkillStoreRoot())
	merged, _, err := cfg.Merge(json.RawMessage(`{"local":{"skills_root":"s2"}}`), json.Unmarshal)
	require.NoError(t, err)
	assert.Equal(t, "/var/lib/boxrt/s2", merged.SkillStoreRoot(), "relative skills_root, no host_root")
	merged, _, err = cfg.Merge(json.RawMessage(`{"local":{"host_root":"/srv/box"}}`), json.Unmarshal)
	require.NoError(t, err)
	assert.Equal(t, "/srv/box/skills", merged.SkillStoreRoot(), "host_root set")
	merged, _, err = merged.Merge(json.RawMessage(`{"local":{"skills_root":"/abs/skills"}}`), json.Unmarshal)
	require.NoError(t, err)
	assert.Equal(t, "/abs/skills", merged.SkillStoreRoot(), "absolute skills_root")
	assert.True(t, filepath.IsAbs(DefaultConfig().SkillStoreRoot()), "without a state directory: the reference's ./data/box, made absolute")
	assert.Equal(t, "skills", filepath.Base(DefaultConfig().SkillStoreRoot()))
}

// TestExecReportsRestarted: a backend that had to start the session's
// sandbox afresh says so in the exec's result, and the session's info
// says so from then on.
func TestExecReportsRestarted(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	rt, _ := newTestRuntime(t, fb, "")
	s := spec("s")
	s.Cmd = "true"
	res, err := rt.Execs().Exec(ctx, s)
	require.NoError(t, err)
	assert.False(t, res.Restarted)
	d, err := rt.GetSession(ctx, "s")
	require.NoError(t, err)
	assert.False(t, d.Restarted)

	fb.execFn = func(context.Context, backends.Session, backends.ExecRequest) (backends.ExitStatus, error) {
		return backends.ExitStatus{Restarted: true}, nil
	}
	res, err = rt.Execs().Exec(ctx, s)
	require.NoError(t, err)
	assert.True(t, res.Restarted)
	d, err = rt.GetSession(ctx, "s")
	require.NoError(t, err)
	assert.True(t, d.Restarted)
	data, err := json.Marshal(d)
	require.NoError(t, err)
	assert.Contains(t, string(data), `"restarted":true`)
}
