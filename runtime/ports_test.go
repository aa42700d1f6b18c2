package runtime

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// dialingFake is a fake backend that can reach ports.
type dialingFake struct{ *fakeBackend }

func (dialingFake) DialSessionPort(context.Context, backends.Session, int) (net.Conn, error) {
	return nil, errors.New("nothing listens")
}

func TestPortTokens(t *testing.T) {
	rt, clock := newTestRuntime(t, dialingFake{newFake()}, "")
	ctx := context.Background()
	_, err := rt.CreateSession(ctx, Spec{SandboxSpec: backends.SandboxSpec{SessionID: "s"}})
	require.NoError(t, err)
	ports := rt.Ports()

	x, err := ports.Expose(ctx, "s", 8000, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "/v1/sessions/s/ports/8000/", x.Path)
	require.NoError(t, ports.Authorize("s", 8000, x.Token))
	for name, c := range map[string]struct {
		session string
		port    int
		token   string
	}{
		"another port":    {"s", 8001, x.Token},
		"another session": {"t", 8000, x.Token},
		"no token":        {"s", 8000, ""},
		"not base64":      {"s", 8000, "!!"},
		"one bit off":     {"s", 8000, x.Token[:10] + string(x.Token[10]^1) + x.Token[11:]},
	} {
		assert.ErrorIs(t, ports.Authorize(c.session, c.port, c.token), ErrPortToken, name)
	}

	// A new exposure of the port revokes the old token.
	y, err := ports.Expose(ctx, "s", 8000, time.Minute)
	require.NoError(t, err)
	assert.ErrorIs(t, ports.Authorize("s", 8000, x.Token), ErrPortToken)
	require.NoError(t, ports.Authorize("s", 8000, y.Token))

	clock.Advance(time.Minute)
	assert.ErrorIs(t, ports.Authorize("s", 8000, y.Token), ErrPortToken, "expired")

	z, err := ports.Expose(ctx, "s", 8000, 0)
	require.NoError(t, err)
	assert.Equal(t, clock.Now().Add(DefaultPortTTL), z.ExpiresAt)
	ok, err := ports.Unexpose(ctx, "s", 8000)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.ErrorIs(t, ports.Authorize("s", 8000, z.Token), ErrPortToken, "unexposed")

	z, err = ports.Expose(ctx, "s", 8000, 0)
	require.NoError(t, err)
	require.NoError(t, rt.DeleteSession(ctx, "s"))
	assert.ErrorIs(t, ports.Authorize("s", 8000, z.Token), ErrPortToken, "session deleted")

	_, err = ports.Expose(ctx, "s", 8000, 0)
	assert.ErrorIs(t, err, boxerr.ErrSessionNotFound)
	_, err = ports.Expose(ctx, "s", 0, 0)
	assert.ErrorIs(t, err, boxerr.ErrValidation)
}

func TestPortsNeedADialer(t *testing.T) {
	rt, _ := newTestRuntime(t, newFake(), "")
	ctx := context.Background()
	_, err := rt.CreateSession(ctx, Spec{SandboxSpec: backends.SandboxSpec{SessionID: "s"}})
	require.NoError(t, err)
	_, err = rt.Ports().Expose(ctx, "s", 8000, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fake backend cannot reach a session's ports")
}

func TestEventsSubscribers(t *testing.T) {
	rt, _ := newTestRuntime(t, newFake(), "")
	ctx := context.Background()
	all, err := rt.Events().Subscribe(ctx, "")
	require.NoError(t, err)
	defer all.Close()
	one, err := rt.Events().Subscribe(ctx, "b")
	require.NoError(t, err)
	defer one.Close()
	p := tenant.Placement{Instance: "i", Workspace: "w", Generation: 1}
	other, err := rt.Events().Subscribe(tenant.WithPlacement(ctx, p), "")
	require.NoError(t, err)
	defer other.Close()

	for _, id := range []string{"a", "b"} {
		_, err := rt.CreateSession(ctx, Spec{SandboxSpec: backends.SandboxSpec{SessionID: id}})
		require.NoError(t, err)
	}
	require.NoError(t, rt.DeleteSession(ctx, "a"))
	var got []string
	for len(all.C()) > 0 {
		ev := <-all.C()
		got = append(got, ev.SessionID+" "+ev.Type)
	}
	assert.Equal(t, []string{"a created", "b created", "a deleted"}, got)
	require.Len(t, one.C(), 1)
	assert.Equal(t, "b", (<-one.C()).SessionID)
	assert.Empty(t, other.C(), "another namespace hears nothing of the default one's sessions")

	// A full queue drops and counts; publishing never blocks.
	for i := 0; i < SubscriberQueue+10; i++ {
		rt.events.publish("b", EventPortExposed, nil)
	}
	assert.Len(t, one.C(), SubscriberQueue)
	assert.Equal(t, int64(10), one.Dropped())
	assert.Equal(t, int64(10), all.Dropped())
	assert.Equal(t, int64(20), rt.Events().Dropped(), "both subscribers' losses; the webhook, with no URL, queues nothing")
}

func TestReapedEvent(t *testing.T) {
	rt, clock := newTestRuntime(t, newFake(), `{"limits":{"session_ttl_sec":60},"durable":{"idle_policy":"destroy"}}`)
	ctx := context.Background()
	sub, err := rt.Events().Subscribe(ctx, "idle")
	require.NoError(t, err)
	defer sub.Close()
	_, err = rt.CreateSession(ctx, Spec{SandboxSpec: backends.SandboxSpec{SessionID: "idle"}})
	require.NoError(t, err)
	clock.Advance(2 * time.Minute)
	require.Equal(t, 1, rt.Reap(ctx))
	require.Len(t, sub.C(), 2)
	assert.Equal(t, EventCreated, (<-sub.C()).Type)
	ev := <-sub.C()
	assert.Equal(t, EventReaped, ev.Type)
	assert.Equal(t, map[string]any{"reason": "ttl"}, ev.Details)
	assert.Equal(t, clock.Now(), ev.At)
}
