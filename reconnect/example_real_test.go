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
// the real binary (`boxrt serve --listen`, its generated token found in its state directory) and
// asserts what the examples show: a command's output, and a wire error
// that matches its sentinel with the code, type and retryability boxrt
// really sends.
func TestRealDialExample(t *testing.T) {
	needRealBinary(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	noTokenEnv(t)
	state := t.TempDir()
	addr, _ := startServe(t, state, stderr)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inits := 0
	c, err := Dial(ctx, "http://"+addr,
		WithStateDir(state), // the examples' runtime uses the default one
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

	res, err := c.Exec(ctx, ExecSpec{SessionID: "s1", Cmd: "echo hi"})
	require.NoError(t, err)
	require.NotNil(t, res.ExitCode)
	assert.Equal(t, 0, *res.ExitCode)
	assert.Equal(t, "hi\n", res.Stdout)
	// Before c.Close (deferred above): the session goes with the client.
	defer func() { assert.NoError(t, c.DeleteSession(ctx, "s1")) }()

	_, err = c.GetSession(ctx, "gone")
	require.ErrorIs(t, err, ErrSessionNotFound)
	assert.NotErrorIs(t, err, ErrRuntimeUnavailable)
	var e *Error
	require.True(t, errors.As(err, &e), "%T is not a *reconnect.Error", err)
	assert.Equal(t, int64(-32004), e.Code)
	assert.Equal(t, "BoxSessionNotFoundError", e.Type)
	assert.False(t, e.Retryable)
	assert.Contains(t, e.Message, "gone")
}
