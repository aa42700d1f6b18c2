package runtime

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
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
			if _, err := rt.StartProcess(context.Background(), "long", backends.ProcessSpec{Command: "mcp"}); err != nil {
				return err
			}
			return rt.StopProcess(context.Background(), "long", "")
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFake()
			release := make(chan struct{})
			fb.execFn = func(ctx context.Context, _ backends.Session, _ backends.ExecRequest) (backends.ExitStatus, error) {
				select {
				case <-ctx.Done(): // the backend kills the command tree
					return backends.ExitStatus{TimedOut: true}, ctx.Err()
				case <-release:
					return backends.ExitStatus{}, nil
				}
			}
			rt, _ := newTestRuntime(t, fb, "")
			s := spec("long")
			s.Cmd = "sleep 300"
			s.TimeoutSec = 300
			execErr := make(chan error, 1)
			go func() { _, err := rt.Exec(context.Background(), s); execErr <- err }()
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
