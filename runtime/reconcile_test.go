package runtime

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
)

// censusFake answers Existing from its dead set, counting the calls.
type censusFake struct {
	*fakeBackend
	calls int
}

func (c *censusFake) Existing(context.Context) (map[string]bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	out := map[string]bool{}
	for i := 1; i <= c.started; i++ {
		if id := fmt.Sprintf("box-%d", i); !c.dead[id] {
			out[id] = true
		}
	}
	return out, nil
}

func TestReconcileMarksGoneSandboxesLost(t *testing.T) {
	for _, census := range []bool{true, false} {
		t.Run(fmt.Sprintf("census=%v", census), func(t *testing.T) {
			fake := newFake()
			var fb backends.Backend = fake
			if census {
				fb = &censusFake{fakeBackend: fake}
			}
			rt, _ := newTestRuntime(t, fb, "")
			ctx := context.Background()
			a, err := rt.CreateSession(ctx, spec("a"))
			require.NoError(t, err)
			assert.True(t, a.SessionCreated)
			_, err = rt.CreateSession(ctx, spec("b"))
			require.NoError(t, err)
			again, err := rt.CreateSession(ctx, spec("a"))
			require.NoError(t, err)
			assert.False(t, again.SessionCreated)

			fake.mu.Lock()
			fake.dead[a.BackendSessionID] = true
			fake.mu.Unlock()
			rt.Reconcile(ctx)
			states := map[string]string{}
			for _, s := range rt.ListSessions(ctx) {
				states[s.SessionID] = s.State
			}
			assert.Equal(t, map[string]string{"a": backends.StateLost, "b": ""}, states)
			if c, ok := fb.(*censusFake); ok {
				assert.Equal(t, 1, c.calls, "one census call for all sessions")
			}

			run := spec("a")
			run.Cmd = "true"
			res, err := rt.Execs().Exec(ctx, run)
			require.NoError(t, err)
			assert.True(t, res.SessionCreated, "a lost session is made again by its next use")
			d, err := rt.GetSession(ctx, "a")
			require.NoError(t, err)
			assert.NotEqual(t, a.BackendSessionID, d.BackendSessionID)
			assert.Empty(t, d.State)
		})
	}
}

func TestSessionsEndingAtClose(t *testing.T) {
	fb := newFake()
	rt, _ := newTestRuntime(t, fb, "", WithSessionsEndingAtClose())
	p := spec("p")
	p.Persistent = true
	_, err := rt.CreateSession(context.Background(), p)
	require.NoError(t, err)
	require.NoError(t, rt.Close(context.Background()))
	fb.mu.Lock()
	defer fb.mu.Unlock()
	assert.Len(t, fb.stopped, 1, "the persistent session ended with the runtime")
}
