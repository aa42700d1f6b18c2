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

// gatedBackend is a fakeBackend whose Probe waits for a gate, so that
// callers pile up behind a backend selection.
type gatedBackend struct {
	*fakeBackend
	gate <-chan struct{}
}

func (g gatedBackend) Probe(ctx context.Context) error {
	select {
	case <-g.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestBackendSelectionSingleFlight: first calls that arrive together share
// one selection: one backend is built, probed and adopted.
func TestBackendSelectionSingleFlight(t *testing.T) {
	gate := make(chan struct{})
	var built atomic.Int32
	fb := newFake()
	factory := func(string, Config, string, string) (backends.Backend, error) {
		built.Add(1)
		return gatedBackend{fakeBackend: fb, gate: gate}, nil
	}
	rt, err := New(DefaultConfig(), factory, t.TempDir(), WithClock(&fakeClock{now: time.Unix(0, 0)}))
	require.NoError(t, err)
	// No Start: the first calls select the backend themselves.
	const callers = 4
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := rt.EnsureSession(context.Background(), spec(string(rune('a'+i))))
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return built.Load() >= 1 }, 10*time.Second, time.Millisecond)
	// Give the other callers every chance to start a selection of their
	// own while the first probe is held; the old code built one each.
	time.Sleep(200 * time.Millisecond)
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, int32(1), built.Load(), "backends built")
	require.NoError(t, rt.Close(context.Background()))
}

// TestDeleteInterruptsExec: deleting a session whose exec runs a long
// command kills the command instead of waiting for it; process start and
// stop do not wait for the command either.
func TestDeleteInterruptsExec(t *testing.T) {
	tests := []struct {
		name string
		op   func(t *testing.T, rt *Runtime) error
		// execEnds says whether op ends the exec.
		execEnds bool
	}{
		{"delete", func(t *testing.T, rt *Runtime) error { return rt.DeleteSession(context.Background(), "long") }, true},
		{"process start and stop", func(t *testing.T, rt *Runtime) error {
			if _, err := rt.Processes().Start(context.Background(), "long", backends.ProcessSpec{Command: "mcp"}); err != nil {
				return err
			}
			return rt.Processes().Stop(context.Background(), "long", "")
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFake()
			release := make(chan struct{})
			execUntil(fb, release)
			rt, _ := newTestRuntime(t, fb, "")
			s := spec("long")
			s.Cmd = "sleep 300"
			s.TimeoutSec = 300
			execErr := make(chan error, 1)
			go func() { _, err := rt.Execs().Exec(context.Background(), s); execErr <- err }()
			require.Eventually(t, func() bool {
				fb.mu.Lock()
				defer fb.mu.Unlock()
				return fb.inFlight["long"] == 1
			}, 10*time.Second, time.Millisecond)

			opErr := make(chan error, 1)
			go func() { opErr <- tc.op(t, rt) }()
			select {
			case err := <-opErr:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				close(release)
				t.Fatalf("%s waited for the running command", tc.name)
			}
			if !tc.execEnds {
				close(release)
				require.NoError(t, <-execErr)
				return
			}
			err := <-execErr
			require.ErrorIs(t, err, boxerr.ErrSessionNotFound)
			fb.mu.Lock()
			assert.Equal(t, 1, fb.started, "the deleted session was not recreated")
			fb.mu.Unlock()
		})
	}
}

// execUntil makes fb's execs run until their context ends (the backend
// kills the command tree) or release is closed.
func execUntil(fb *fakeBackend, release <-chan struct{}) {
	fb.execFn = func(ctx context.Context, _ backends.Session, _ backends.ExecRequest) (backends.ExitStatus, error) {
		select {
		case <-ctx.Done():
			return backends.ExitStatus{TimedOut: true}, ctx.Err()
		case <-release:
			return backends.ExitStatus{}, nil
		}
	}
}

// waitFor fails t unless ch yields within d; what names what was awaited.
func waitFor[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: still waiting after %v", what, d)
		panic("unreachable")
	}
}

// TestRecreateDoesNotHoldUpDelete: a recreate (the extra mounts changed)
// waits for the session's running exec while holding the id lock; a delete
// or a shutdown arriving then interrupts the exec instead of waiting for
// it behind the recreate, and no sandbox is left behind.
func TestRecreateDoesNotHoldUpDelete(t *testing.T) {
	tests := []struct {
		name string
		op   func(rt *Runtime) error
		// execErr is what the exec gets (nil: status canceled).
		execErr error
		// recreateErr is what the recreate gets (nil: it succeeds).
		recreateErr error
	}{
		{"box_delete_session", func(rt *Runtime) error { return rt.DeleteSession(context.Background(), "r") },
			boxerr.ErrSessionNotFound, nil},
		{"box_shutdown", func(rt *Runtime) error { return rt.ShutdownAll(context.Background()) },
			boxerr.ErrSessionNotFound, nil},
		{"runtime close", func(rt *Runtime) error { return rt.Close(context.Background()) },
			nil, boxerr.ErrRuntimeUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFake()
			release := make(chan struct{})
			execUntil(fb, release)
			root := t.TempDir()
			rt, _ := newTestRuntime(t, fb, `{"local":{"allowed_mount_roots":["`+root+`"]}}`)
			long := spec("r")
			long.Cmd, long.TimeoutSec = "sleep 300", 300
			type result struct {
				res ExecResult
				err error
			}
			execDone := make(chan result, 1)
			go func() { res, err := rt.Execs().Exec(context.Background(), long); execDone <- result{res, err} }()
			require.Eventually(t, func() bool {
				fb.mu.Lock()
				defer fb.mu.Unlock()
				return fb.inFlight["r"] == 1
			}, 10*time.Second, time.Millisecond)

			remount := spec("r")
			remount.ExtraMounts = []backends.MountSpec{{HostPath: root, MountPath: "/data", Mode: backends.MountRO}}
			recreateErr := make(chan error, 1)
			go func() { _, err := rt.EnsureSession(context.Background(), remount); recreateErr <- err }()
			// The recreate now waits for the exec, holding the id lock.
			require.Eventually(t, func() bool {
				s := rt.sessions.get("r")
				return s != nil && rt.sessions.isDeleting(s)
			}, 10*time.Second, time.Millisecond)

			opErr := make(chan error, 1)
			go func() { opErr <- tc.op(rt) }()
			select {
			case err := <-opErr:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				close(release)
				<-opErr
				t.Fatalf("%s waited for the exec a recreate waited for", tc.name)
			}
			ex := waitFor(t, execDone, 10*time.Second, "exec")
			if tc.execErr != nil {
				require.ErrorIs(t, ex.err, tc.execErr)
			} else {
				require.NoError(t, ex.err)
				assert.Equal(t, StatusCanceled, ex.res.Status)
			}
			err := waitFor(t, recreateErr, 10*time.Second, "recreate")
			if tc.recreateErr == nil {
				require.NoError(t, err)
				// The recreate made its session before the delete, which
				// waited for the id lock, deleted it.
				_, err := rt.GetSession(context.Background(), "r")
				require.ErrorIs(t, err, boxerr.ErrSessionNotFound)
			} else {
				require.ErrorIs(t, err, tc.recreateErr)
			}
			assert.Empty(t, fb.orphans(), "sandboxes never stopped")
		})
	}
}

// TestCloseWaitsForCreations: Close waits for a session creation or a
// process start under way, and what they made is stopped before the
// backend closes: no orphan sandbox, no process left running.
func TestCloseWaitsForCreations(t *testing.T) {
	tests := []struct {
		name string
		// hold sets the backend hook that holds the start.
		hold func(fb *fakeBackend, hook func())
		// start begins the creation; its error is what the caller gets.
		start   func(rt *Runtime) error
		wantErr error
		// kept are the sandboxes Close keeps (persistent sessions).
		kept []string
	}{
		{"session creation", func(fb *fakeBackend, hook func()) { fb.beforeStart = hook },
			func(rt *Runtime) error {
				_, err := rt.EnsureSession(context.Background(), spec("c"))
				return err
			}, boxerr.ErrRuntimeUnavailable, nil},
		{"managed process start", func(fb *fakeBackend, hook func()) { fb.beforeProcess = hook },
			func(rt *Runtime) error {
				_, err := rt.Processes().Start(context.Background(), "c", backends.ProcessSpec{Command: "mcp"})
				return err
			}, nil, []string{"box-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFake()
			rt, _ := newTestRuntime(t, closableFake{fb}, "")
			if tc.name != "session creation" {
				// Persistent: Close keeps the session, so only its
				// waiting for the start stops the process.
				persistent := spec("c")
				persistent.Persistent = true
				_, err := rt.EnsureSession(context.Background(), persistent)
				require.NoError(t, err)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			tc.hold(fb, func() {
				close(entered)
				<-release
			})
			startErr := make(chan error, 1)
			go func() { startErr <- tc.start(rt) }()
			waitFor(t, entered, 10*time.Second, "start reached the backend")

			closed := make(chan error, 1)
			go func() { closed <- rt.Close(context.Background()) }()
			select {
			case <-closed:
				close(release)
				<-startErr
				t.Fatal("Close returned while a start was under way")
			case <-time.After(200 * time.Millisecond):
			}
			close(release)
			err := waitFor(t, startErr, 10*time.Second, "start")
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.NoError(t, waitFor(t, closed, 10*time.Second, "Close"))
			assert.Equal(t, tc.kept, fb.orphans(), "sandboxes not stopped")
			fb.mu.Lock()
			defer fb.mu.Unlock()
			for _, p := range fb.procs {
				select {
				case <-p.done:
				default:
					t.Error("a managed process outlived Close")
				}
			}
		})
	}
}

// TestProcessCapacityAcrossSessions: max_managed_processes holds when
// starts on different sessions race: a start under way counts.
func TestProcessCapacityAcrossSessions(t *testing.T) {
	fb := newFake()
	rt, _ := newTestRuntime(t, fb, `{"limits":{"max_managed_processes":1}}`)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, err := rt.EnsureSession(ctx, spec(id))
		require.NoError(t, err)
	}
	var calls atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	fb.beforeProcess = func() {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
	}
	first := make(chan error, 1)
	go func() {
		_, err := rt.Processes().Start(ctx, "a", backends.ProcessSpec{Command: "mcp"})
		first <- err
	}()
	waitFor(t, entered, 10*time.Second, "first start reached the backend")
	_, err := rt.Processes().Start(ctx, "b", backends.ProcessSpec{Command: "mcp"})
	close(release)
	require.NoError(t, waitFor(t, first, 10*time.Second, "first start"))
	require.ErrorIs(t, err, boxerr.ErrCapacityExceeded, "a second start while the first was under way")
	assert.Equal(t, 1, rt.Status().ManagedProcesses)
	// The reservation is released with the start: a stop makes room.
	require.NoError(t, rt.Processes().Stop(ctx, "a", ""))
	_, err = rt.Processes().Start(ctx, "b", backends.ProcessSpec{Command: "mcp"})
	require.NoError(t, err)
}

// TestReselectKeepsBackendOfNewSession: a box_init that changes the
// backend section reselects only while no session exists; a session
// created on the old backend while the new one is probed keeps the old
// backend in place, so its sandbox stays reachable (and is stopped by a
// delete).
func TestReselectKeepsBackendOfNewSession(t *testing.T) {
	oldFB, newFB := newFake(), newFake()
	gate := make(chan struct{})
	probing := make(chan struct{}, 1)
	factory := func(name string, _ Config, _, _ string) (backends.Backend, error) {
		if name == "bwrap" {
			probing <- struct{}{}
			return gatedBackend{fakeBackend: newFB, gate: gate}, nil
		}
		return oldFB, nil
	}
	rt, err := New(DefaultConfig(), factory, t.TempDir(), WithClock(&fakeClock{now: time.Unix(0, 0)}))
	require.NoError(t, err)
	ctx := context.Background()
	rt.Start(ctx)
	defer func() { require.NoError(t, rt.Close(ctx)) }()

	applied := make(chan error, 1)
	go func() {
		_, err := rt.ApplyConfig(ctx, json.RawMessage(`{"backend":"bwrap"}`), json.Unmarshal)
		applied <- err
	}()
	waitFor(t, probing, 10*time.Second, "reselection probing")
	info, err := rt.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	close(gate)
	require.NoError(t, waitFor(t, applied, 10*time.Second, "box_init"))

	assert.Equal(t, "box-1", info.BackendSessionID)
	require.NoError(t, rt.DeleteSession(ctx, "s"))
	assert.Empty(t, oldFB.orphans(), "the old backend's sandbox was stopped")
	newFB.mu.Lock()
	assert.Empty(t, newFB.stopped, "the new backend was asked to stop a sandbox it never made")
	newFB.mu.Unlock()
}
