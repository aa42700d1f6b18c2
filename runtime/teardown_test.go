package runtime

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// killingFake is a fake backend that can kill sandboxes in bulk and whose
// StopSession takes a while, counting how many run at once.
type killingFake struct {
	*fakeBackend
	mu            sync.Mutex
	killed        []string
	stopsBefore   int // StopSession calls made before KillSandboxes
	running, peak int
}

func (k *killingFake) KillSandboxes(_ context.Context, infos []backends.Session) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, info := range infos {
		k.killed = append(k.killed, info.BackendSessionID)
	}
}

func (k *killingFake) StopSession(ctx context.Context, info backends.Session) error {
	k.mu.Lock()
	if k.killed == nil {
		k.stopsBefore++
	}
	k.running++
	k.peak = max(k.peak, k.running)
	k.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	k.mu.Lock()
	k.running--
	k.mu.Unlock()
	return k.fakeBackend.StopSession(ctx, info)
}

// TestCloseDestroysManySessionsBounded: at exit the non-persistent
// sessions' sandboxes are killed in one call, before any is stopped; the
// stops then run concurrently, never more than teardownParallelism at
// once, and every one of those sessions (and none of the persistent ones)
// goes.
func TestCloseDestroysManySessionsBounded(t *testing.T) {
	ctx := context.Background()
	kf := &killingFake{fakeBackend: newFake()}
	rt, _ := newTestRuntime(t, kf, `{"limits":{"max_sessions":200}}`)
	n := 3*teardownParallelism() + 5
	var plain []string
	for i := range n {
		s := spec(fmt.Sprintf("s%d", i))
		s.Persistent = i%10 == 0
		info, err := rt.EnsureSession(ctx, s)
		require.NoError(t, err)
		if !s.Persistent {
			plain = append(plain, info.BackendSessionID)
		}
	}
	require.NoError(t, rt.Close(ctx))

	kf.mu.Lock()
	defer kf.mu.Unlock()
	assert.ElementsMatch(t, plain, kf.killed, "one bulk kill of the sessions that go")
	assert.Zero(t, kf.stopsBefore, "no StopSession before the bulk kill")
	assert.LessOrEqual(t, kf.peak, teardownParallelism(), "StopSession calls at once")
	assert.Greater(t, kf.peak, 1, "the StopSession calls overlap")
	kf.fakeBackend.mu.Lock()
	assert.ElementsMatch(t, plain, kf.fakeBackend.stopped)
	kf.fakeBackend.mu.Unlock()
}

// TestShutdownAllInterruptsExecs: box_shutdown kills the sandbox of a
// session whose box_exec runs, and the exec's caller hears that the
// session was deleted, as with box_delete_session.
func TestShutdownAllInterruptsExecs(t *testing.T) {
	ctx := context.Background()
	kf := &killingFake{fakeBackend: newFake()}
	release := make(chan struct{})
	defer close(release)
	execUntil(kf.fakeBackend, release)
	rt, _ := newTestRuntime(t, kf, "")
	long := spec("busy")
	long.Cmd, long.TimeoutSec = "sleep 300", 300
	done := make(chan error, 1)
	go func() { _, err := rt.Execs().Exec(ctx, long); done <- err }()
	require.Eventually(t, func() bool {
		kf.fakeBackend.mu.Lock()
		defer kf.fakeBackend.mu.Unlock()
		return kf.fakeBackend.inFlight["busy"] == 1
	}, 10*time.Second, time.Millisecond)

	require.NoError(t, rt.ShutdownAll(ctx))
	err := waitFor(t, done, 10*time.Second, "the interrupted box_exec")
	require.Error(t, err)
	assert.ErrorIs(t, err, boxerr.ErrSessionNotFound)
	assert.ErrorIs(t, err, errDeleted)
	kf.mu.Lock()
	defer kf.mu.Unlock()
	assert.Len(t, kf.killed, 1)
	assert.Empty(t, rt.ListSessions(ctx))
}
