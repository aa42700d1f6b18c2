package runtime

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
)

// poolingFake is a fake backend whose sandboxes can be pooled.
type poolingFake struct{ *fakeBackend }

func (p poolingFake) Claim(_ context.Context, info backends.Session, spec backends.SandboxSpec) (backends.Session, error) {
	info.SessionID = spec.SessionID
	return info, nil
}

// The pool loop sleeps while the configuration has no pool, and a
// box_init wakes it: one that removes the pool gets its sandbox stopped,
// one that adds it back gets it filled again.
func TestPoolLoopFollowsConfigChanges(t *testing.T) {
	fb := newFake()
	rt, _ := newTestRuntime(t, poolingFake{fb}, `{"durable":{"pools":[{"name":"warm","size":1}]}}`)
	ctx := context.Background()
	ready := func() int {
		st := rt.pools.status(rt.Config().Durable)
		if len(st) == 0 {
			return -1
		}
		return st[0].Ready
	}
	require.Eventually(t, func() bool { return ready() == 1 }, 10*time.Second, time.Millisecond, "the pool was never filled")

	_, err := rt.ApplyConfig(ctx, json.RawMessage(`{"durable":{"pools":[]}}`), json.Unmarshal)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(fb.orphans()) == 0 }, 10*time.Second, time.Millisecond,
		"the pooled sandbox of a removed pool was never stopped")
	// Let the loop find no pool and go to sleep; only box_init wakes it.
	time.Sleep(200 * time.Millisecond)

	_, err = rt.ApplyConfig(ctx, json.RawMessage(`{"durable":{"pools":[{"name":"warm","size":1}]}}`), json.Unmarshal)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return ready() == 1 }, 10*time.Second, time.Millisecond,
		"the pool box_init added back was never filled")
	assert.Equal(t, 2, fb.started)
}
