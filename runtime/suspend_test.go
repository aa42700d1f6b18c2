package runtime

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// suspendFake is a fakeBackend that can suspend; Resume is slow so that
// concurrent callers overlap.
type suspendFake struct {
	*fakeBackend
	suspends, resumes atomic.Int32
}

func (f *suspendFake) Suspend(context.Context, backends.Session) error {
	f.suspends.Add(1)
	return nil
}

func (f *suspendFake) Resume(context.Context, backends.Session) error {
	time.Sleep(20 * time.Millisecond)
	f.resumes.Add(1)
	return nil
}

// persistentOnlyFake suspends only persistent sessions, as kube does.
type persistentOnlyFake struct{ *suspendFake }

func (persistentOnlyFake) CanSuspend(info backends.Session) bool { return info.Persistent }

func newSuspendRuntime(t *testing.T, patch string) (*Runtime, *suspendFake, *fakeClock) {
	return newSuspendRuntimeOf(t, patch, func(sf *suspendFake) backends.Backend { return sf })
}

func newSuspendRuntimeOf(t *testing.T, patch string, wrap func(*suspendFake) backends.Backend) (*Runtime, *suspendFake, *fakeClock) {
	sf := &suspendFake{fakeBackend: newFake()}
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := DefaultConfig()
	if patch != "" {
		var err error
		cfg, _, err = cfg.Merge([]byte(patch), json.Unmarshal)
		require.NoError(t, err)
	}
	factory := func(string, Config, string, string) (backends.Backend, error) { return wrap(sf), nil }
	rt, err := New(cfg, factory, t.TempDir(), WithClock(clock))
	require.NoError(t, err)
	rt.Start(context.Background())
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	return rt, sf, clock
}

func TestIdlePolicy(t *testing.T) {
	for _, tc := range []struct {
		name, policy       string
		persistentOnly     bool   // the backend is a SuspendChecker refusing non-persistent sessions
		persistentState    string // "" = destroyed
		nonPersistentState string
	}{
		{"auto suspends persistent, destroys others", IdleAuto, false, backends.StateSuspended, ""},
		{"suspend suspends all", IdleSuspend, false, backends.StateSuspended, backends.StateSuspended},
		{"suspend destroys what the backend cannot suspend", IdleSuspend, true, backends.StateSuspended, ""},
		{"destroy keeps persistent running", IdleDestroy, false, backends.StateRunning, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			wrap := func(sf *suspendFake) backends.Backend {
				if tc.persistentOnly {
					return persistentOnlyFake{sf}
				}
				return sf
			}
			rt, _, clock := newSuspendRuntimeOf(t, `{"limits":{"session_ttl_sec":60},"durable":{"idle_policy":"`+tc.policy+`"}}`, wrap)
			for _, id := range []string{"p", "n"} {
				s := spec(id)
				s.Persistent = id == "p"
				_, err := rt.EnsureSession(ctx, s)
				require.NoError(t, err)
			}
			clock.Advance(61 * time.Second)
			rt.Reap(ctx)
			state := func(id string) string {
				d, err := rt.GetSession(context.Background(), id)
				if err != nil {
					return ""
				}
				if d.State == "" {
					return backends.StateRunning
				}
				return d.State
			}
			assert.Equal(t, tc.persistentState, state("p"))
			assert.Equal(t, tc.nonPersistentState, state("n"))
		})
	}
}

func TestSuspendRefusedBySuspendChecker(t *testing.T) {
	ctx := context.Background()
	rt, sf, _ := newSuspendRuntimeOf(t, "", func(sf *suspendFake) backends.Backend { return persistentOnlyFake{sf} })
	_, err := rt.EnsureSession(ctx, spec("n"))
	require.NoError(t, err)
	_, err = rt.SuspendSession(ctx, "n")
	require.ErrorIs(t, err, boxerr.ErrBox)
	assert.Contains(t, err.Error(), "cannot suspend session n")
	assert.Equal(t, int32(0), sf.suspends.Load(), "the backend was not asked")
	d, err := rt.GetSession(context.Background(), "n")
	require.NoError(t, err)
	assert.NotEqual(t, backends.StateSuspended, d.State)
}

func TestConcurrentResumeResumesOnce(t *testing.T) {
	ctx := context.Background()
	rt, sf, _ := newSuspendRuntime(t, "")
	_, err := rt.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	info, err := rt.SuspendSession(ctx, "s")
	require.NoError(t, err)
	assert.Equal(t, backends.StateSuspended, info.State)

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 3 {
			case 0:
				_, err := rt.ResumeSession(ctx, "s")
				assert.NoError(t, err)
			case 1:
				s := spec("s")
				s.Cmd = "echo hi"
				res, err := rt.Execs().Exec(ctx, s)
				assert.NoError(t, err)
				assert.Equal(t, "echo hi", res.Stdout)
			default:
				assert.NoError(t, rt.Acquire(ctx, "s"))
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(1), sf.resumes.Load(), "resumed once")
	assert.Equal(t, 1, sf.started, "no recreation")
	d, err := rt.GetSession(context.Background(), "s")
	require.NoError(t, err)
	assert.Equal(t, backends.StateRunning, d.State)
}

func TestResumeRestartsProcesses(t *testing.T) {
	ctx := context.Background()
	rt, _, _ := newSuspendRuntime(t, "")
	_, err := rt.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	_, err = rt.Processes().Start(ctx, "s", backends.ProcessSpec{Command: "cat"})
	require.NoError(t, err)

	_, err = rt.SuspendSession(ctx, "s")
	require.NoError(t, err)
	d, err := rt.GetSession(context.Background(), "s")
	require.NoError(t, err)
	assert.Empty(t, d.ManagedProcesses, "a suspended session runs nothing")

	_, err = rt.ResumeSession(ctx, "s")
	require.NoError(t, err)
	p, err := rt.Processes().Get(context.Background(), "s", "")
	require.NoError(t, err)
	assert.Equal(t, ProcessRunning, p.Status)
	assert.True(t, p.Resumed, "the process is flagged: its earlier output is gone")

	// Starting a process on a suspended session resumes it.
	_, err = rt.SuspendSession(ctx, "s")
	require.NoError(t, err)
	p, err = rt.Processes().Start(ctx, "s", backends.ProcessSpec{ProcessID: "other", Command: "cat"})
	require.NoError(t, err)
	assert.False(t, p.Resumed)
	d, err = rt.GetSession(context.Background(), "s")
	require.NoError(t, err)
	assert.Equal(t, backends.StateRunning, d.State)
	assert.Len(t, d.ManagedProcesses, 2)
}

// TestSuspendedSessionKeepsItsProcesses: a suspended session's processes
// are still there for the host; reading or stopping one resumes the
// session instead of answering that the process does not exist.
func TestSuspendedSessionKeepsItsProcesses(t *testing.T) {
	ctx := context.Background()
	rt, sf, _ := newSuspendRuntime(t, "")
	_, err := rt.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	_, err = rt.Processes().Start(ctx, "s", backends.ProcessSpec{Command: "cat"})
	require.NoError(t, err)
	_, err = rt.Processes().Start(ctx, "s", backends.ProcessSpec{ProcessID: "other", Command: "cat"})
	require.NoError(t, err)

	_, err = rt.SuspendSession(ctx, "s")
	require.NoError(t, err)
	p, err := rt.Processes().Get(ctx, "s", "")
	require.NoError(t, err, "the process of a suspended session exists")
	assert.Equal(t, ProcessRunning, p.Status)
	assert.True(t, p.Resumed)
	assert.EqualValues(t, 1, sf.resumes.Load())

	_, err = rt.SuspendSession(ctx, "s")
	require.NoError(t, err)
	require.NoError(t, rt.Processes().Stop(ctx, "s", "other"))
	d, err := rt.GetSession(ctx, "s")
	require.NoError(t, err)
	assert.Equal(t, backends.StateRunning, d.State)
	assert.Len(t, d.ManagedProcesses, 1)

	_, err = rt.Processes().Get(ctx, "s", "nope")
	require.ErrorIs(t, err, boxerr.ErrProcessNotFound)
}

func TestStartProcessWithoutSessionSaysHowToMakeOne(t *testing.T) {
	rt, _, _ := newSuspendRuntime(t, "")
	_, err := rt.Processes().Start(context.Background(), "missing", backends.ProcessSpec{Command: "cat"})
	require.ErrorIs(t, err, boxerr.ErrSessionNotFound)
	assert.Contains(t, err.Error(), "session missing not found")
	assert.Contains(t, err.Error(), "create it with box_create_session")
}

func TestSuspendRefusedWithoutSupport(t *testing.T) {
	ctx := context.Background()
	rt, _ := newTestRuntime(t, newFake(), "")
	_, err := rt.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	_, err = rt.SuspendSession(ctx, "s")
	require.ErrorContains(t, err, "cannot suspend")
}

// TestCloseOrder: Close ends every exec, box_exec on a kept persistent
// session and background ones included, destroys the non-persistent
// running sessions and keeps the persistent and the suspended ones.
func TestCloseOrder(t *testing.T) {
	ctx := context.Background()
	rt, sf, _ := newSuspendRuntime(t, "")
	release := make(chan struct{})
	defer close(release)
	execUntil(sf.fakeBackend, release)
	ids := map[string]string{}
	for _, id := range []string{"persistent", "suspended", "plain"} {
		s := spec(id)
		s.Persistent = id == "persistent"
		info, err := rt.EnsureSession(ctx, s)
		require.NoError(t, err)
		ids[id] = info.BackendSessionID
	}
	_, err := rt.SuspendSession(ctx, "suspended")
	require.NoError(t, err)

	long := spec("persistent")
	long.Persistent = true
	long.Cmd, long.TimeoutSec = "sleep 300", 300
	type result struct {
		res ExecResult
		err error
	}
	execDone := make(chan result, 1)
	go func() { res, err := rt.Execs().Exec(ctx, long); execDone <- result{res, err} }()
	bg := spec("plain")
	bg.Cmd = "sleep 300"
	x, err := rt.Execs().Start(ctx, bg, ExecOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		sf.mu.Lock()
		defer sf.mu.Unlock()
		return sf.inFlight["persistent"] == 1 && sf.inFlight["plain"] == 1
	}, 10*time.Second, time.Millisecond)

	require.NoError(t, rt.Close(ctx))
	sf.mu.Lock()
	running := sf.inFlight["persistent"] + sf.inFlight["plain"]
	sf.mu.Unlock()
	require.Zero(t, running, "execs still running in the backend after Close")
	ex := waitFor(t, execDone, 10*time.Second, "box_exec on the kept session")
	require.NoError(t, ex.err)
	assert.Equal(t, StatusCanceled, ex.res.Status)
	// Ended already: a wait returns at once (a deadline would race it).
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	res, err := rt.Execs().Wait(wctx, x.ExecID, 0)
	require.NoError(t, err)
	assert.Equal(t, StatusCanceled, res.Status, "the background exec")
	sf.mu.Lock()
	defer sf.mu.Unlock()
	assert.Equal(t, []string{ids["plain"]}, sf.stopped, "only the non-persistent running session goes")
}
