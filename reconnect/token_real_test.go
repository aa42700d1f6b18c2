//go:build unix

package reconnect

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Dial to a loopback runtime finds the token it generated in its state
// directory, with no token option or variable.
func TestRealDialTokenFromStateDir(t *testing.T) {
	needRealBinary(t)
	noTokenEnv(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	state := t.TempDir()
	addr, _ := startServe(t, state, stderr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, "http://"+addr, WithStateDir(state))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Call(ctx, "__ping", struct{}{}, nil))

	// The default state directory is BOXRT_STATE_DIR, as for boxrt serve.
	t.Setenv("BOXRT_STATE_DIR", state)
	d, err := Dial(ctx, "ws://localhost:"+addr[len("127.0.0.1:"):])
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.Call(ctx, "box_get_sessions", struct{}{}, nil))
}
