package reconnect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// noTokenEnv clears the variables a token is discovered from.
func noTokenEnv(t *testing.T) {
	for _, env := range tokenEnvs {
		t.Setenv(env, "")
	}
}

func writeToken(t *testing.T, dir, tok string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "control-token"), []byte(tok+"\n"), 0o600))
}

func TestDefaultStateDir(t *testing.T) {
	t.Setenv("BOXRT_STATE_DIR", "/srv/boxrt-state")
	assert.Equal(t, "/srv/boxrt-state", DefaultStateDir())
	t.Setenv("BOXRT_STATE_DIR", "")
	t.Setenv("XDG_STATE_HOME", "/xdg")
	t.Setenv("HOME", "/home/u")
	want := "/xdg/boxrt"
	if os.Geteuid() == 0 {
		want = "/var/lib/boxrt"
	}
	assert.Equal(t, want, DefaultStateDir())
	if os.Geteuid() != 0 {
		t.Setenv("XDG_STATE_HOME", "")
		assert.Equal(t, "/home/u/.local/state/boxrt", DefaultStateDir())
	}
}

func TestDiscoverToken(t *testing.T) {
	noTokenEnv(t)
	dir := t.TempDir()
	fileTok := strings.Repeat("f", 40)
	writeToken(t, dir, fileTok)

	tok, err := DiscoverToken("http://127.0.0.1:5410", dir)
	require.NoError(t, err)
	assert.Equal(t, fileTok, tok, "a loopback runtime's generated token")
	tok, err = DiscoverToken("localhost:5410", dir)
	require.NoError(t, err)
	assert.Equal(t, fileTok, tok)
	tok, err = DiscoverToken("wss://box.example:5410", dir)
	require.NoError(t, err)
	assert.Empty(t, tok, "the local state directory is no remote runtime's")
	tok, err = DiscoverToken("ws://[::1]:5410", t.TempDir())
	require.NoError(t, err)
	assert.Empty(t, tok, "no file, no token, no error")

	t.Setenv("LANGBOT_BOX_CONTROL_TOKEN", " langbot-token ")
	tok, err = DiscoverToken("ws://127.0.0.1:5410", dir)
	require.NoError(t, err)
	assert.Equal(t, "langbot-token", tok, "the environment before the file")
	t.Setenv("BOXRT_CONTROL_TOKEN", "boxrt-token")
	tok, err = DiscoverToken("ws://box.example", dir)
	require.NoError(t, err)
	assert.Equal(t, "boxrt-token", tok, "BOXRT_CONTROL_TOKEN first, for any URL")

	noTokenEnv(t)
	writeToken(t, dir, "short")
	_, err = DiscoverToken("ws://127.0.0.1:5410", dir)
	assert.ErrorContains(t, err, "5 characters long")
	require.NoError(t, os.Remove(filepath.Join(dir, "control-token")))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "control-token"), 0o700))
	_, err = DiscoverToken("ws://127.0.0.1:5410", dir)
	assert.ErrorContains(t, err, "reading the generated control token")
}

// Dial without WithToken sends the token a loopback runtime keeps in its
// state directory; with none there, the error says where it looked
// instead of blaming a token that was never sent.
func TestDialDiscoversToken(t *testing.T) {
	noTokenEnv(t)
	tok := strings.Repeat("t", 40)
	f := newFakeWS(t, tok)
	dir := t.TempDir()
	writeToken(t, dir, tok)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, f.URL, WithStateDir(dir), WithLogger(testLogger()))
	require.NoError(t, err)
	require.NoError(t, c.Call(ctx, "__ping", struct{}{}, nil))
	require.NoError(t, c.Close())

	empty := t.TempDir()
	_, err = Dial(ctx, f.URL, WithStateDir(empty))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "refused")
	assert.ErrorContains(t, err, "none was sent: none found in $BOXRT_CONTROL_TOKEN, $LANGBOT_BOX_CONTROL_TOKEN, "+filepath.Join(empty, "control-token"))
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.False(t, e.Retryable)

	_, err = Dial(ctx, f.URL, WithToken(""), WithStateDir(dir))
	assert.ErrorContains(t, err, "none was sent: WithToken gave an empty one")
}
