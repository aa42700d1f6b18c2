//go:build unix

package reconnect

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRealDialExample runs ExampleDial's and ExampleError's steps against
// the real binary (`boxrt serve --listen`, its generated token) and
// asserts what the examples show: a command's output, and a wire error
// that matches its sentinel with the code, type and retryability boxrt
// really sends.
func TestRealDialExample(t *testing.T) {
	needRealBinary(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	addr, token := startServe(t, t.TempDir(), stderr)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inits := 0
	c, err := Dial(ctx, "http://"+addr,
		WithToken(token),
		WithHeartbeat(20*time.Second, 15*time.Second, 3),
		WithBackoff(3*time.Second, time.Minute),
		WithOnConnect(func(ctx context.Context, c Caller) error {
			inits++
			return c.Call(ctx, "box_init", map[string]any{}, nil)
		}),
	)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, 1, inits, "OnConnect runs once per connect")
	requireBackend(t, c)

	var res struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	require.NoError(t, c.Call(ctx, "box_exec", map[string]any{"session_id": "s1", "cmd": "echo hi"}, &res))
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "hi\n", res.Stdout)
	// Before c.Close (deferred above): the session goes with the client.
	defer func() {
		assert.NoError(t, c.Call(ctx, "box_delete_session", map[string]any{"session_id": "s1"}, nil))
	}()

	err = c.Call(ctx, "box_get_session", map[string]any{"session_id": "gone"}, nil)
	require.ErrorIs(t, err, ErrSessionNotFound)
	assert.NotErrorIs(t, err, ErrRuntimeUnavailable)
	var e *Error
	require.True(t, errors.As(err, &e), "%T is not a *reconnect.Error", err)
	assert.Equal(t, int64(-32004), e.Code)
	assert.Equal(t, "BoxSessionNotFoundError", e.Type)
	assert.False(t, e.Retryable)
	assert.Contains(t, e.Message, "gone")
}
