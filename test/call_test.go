package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runCall runs `boxrt call ARGS…` and returns stdout, stderr and the exit
// status. BOXRT_STATE_DIR keeps --spawn children out of the real state
// directory.
func runCall(t *testing.T, env []string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, append([]string{"call"}, args...)...)
	cmd.Env = append(append(os.Environ(), "BOXRT_STATE_DIR="+t.TempDir(), "BOXRT_CONTROL_TOKEN=", "LANGBOT_BOX_CONTROL_TOKEN="), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err, "stderr: %s", stderr.String())
	}
	return stdout.String(), stderr.String(), code
}

// callError is the JSON `boxrt call` prints for a failed call.
type callError struct {
	Error struct {
		Code      int64          `json:"code"`
		Type      string         `json:"type"`
		Message   string         `json:"message"`
		Retryable bool           `json:"retryable"`
		Data      map[string]any `json:"data"`
	} `json:"error"`
}

func decodeCallError(t *testing.T, stdout string) callError {
	t.Helper()
	var ce callError
	require.NoError(t, json.Unmarshal([]byte(stdout), &ce), "stdout: %q", stdout)
	return ce
}

func TestCallURL(t *testing.T) {
	p := Start(t, Options{})
	url := "ws://" + p.Addr
	// No token is configured: call reads the one boxrt generated in the
	// state directory they share.
	env := []string{"BOXRT_STATE_DIR=" + p.State}

	t.Run("ping prints {} and exits 0", func(t *testing.T) {
		stdout, stderr, code := runCall(t, env, "", "__ping", "--url", url)
		assert.Equal(t, 0, code, "stderr: %s", stderr)
		assert.Equal(t, "{}\n", stdout)
	})

	t.Run("flags before the method work too", func(t *testing.T) {
		stdout, _, code := runCall(t, env, "", "--url", "http://"+p.Addr, "__ping", "{}")
		assert.Equal(t, 0, code)
		assert.Equal(t, "{}\n", stdout)
	})

	t.Run("unknown method exits 1 with the error as JSON", func(t *testing.T) {
		stdout, _, code := runCall(t, env, "", "no_such_method", "--url", url)
		assert.Equal(t, 1, code)
		ce := decodeCallError(t, stdout)
		assert.Equal(t, int64(-32601), ce.Error.Code)
		assert.Equal(t, "MethodNotFound", ce.Error.Type)
		assert.Contains(t, ce.Error.Message, "no_such_method")
		assert.False(t, ce.Error.Retryable)
		assert.Equal(t, map[string]any{"method": "no_such_method"}, ce.Error.Data, "the details, not the type again (#41)")
	})

	t.Run("typed box error with params from stdin", func(t *testing.T) {
		stdout, _, code := runCall(t, env, `{"session_id":"nope"}`, "box_get_session", "-", "--url", url)
		assert.Equal(t, 1, code)
		ce := decodeCallError(t, stdout)
		assert.Equal(t, int64(-32004), ce.Error.Code)
		assert.Equal(t, "BoxSessionNotFoundError", ce.Error.Type)
		assert.Equal(t, 1, strings.Count(stdout, "BoxSessionNotFoundError"), "the type is said once, not in message and data again (#41): %s", stdout)
		assert.Contains(t, ce.Error.Message, "nope")
		assert.Equal(t, map[string]any{"session_id": "nope"}, ce.Error.Data, "data keeps the details")
	})

	t.Run("result is indented JSON", func(t *testing.T) {
		stdout, _, code := runCall(t, env, "", "box_get_backend_info", "--url", url)
		assert.Equal(t, 0, code)
		var info map[string]any
		require.NoError(t, json.Unmarshal([]byte(stdout), &info))
		assert.Contains(t, info, "available")
		assert.Contains(t, stdout, "\n  \"", "indented")
	})

	t.Run("nothing listening: exit 1, retryable runtime-unavailable", func(t *testing.T) {
		start := time.Now()
		stdout, _, code := runCall(t, env, "", "__ping", "--url", "ws://"+freeAddr(t))
		assert.Equal(t, 1, code)
		assert.Less(t, time.Since(start), 10*time.Second, "fails fast, no reconnect backoff")
		ce := decodeCallError(t, stdout)
		assert.Equal(t, "BoxRuntimeUnavailableError", ce.Error.Type)
		assert.True(t, ce.Error.Retryable)
	})
}

func TestCallToken(t *testing.T) {
	token := "call-test-token-0123456789abcdefghijklmnop"
	p := Start(t, Options{Env: []string{"BOXRT_CONTROL_TOKEN=" + token}})
	url := "ws://" + p.Addr
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))

	stdout, stderr, code := runCall(t, nil, "", "__ping", "--url", url, "--token-file", tokenFile)
	assert.Equal(t, 0, code, "stderr: %s", stderr)
	assert.Equal(t, "{}\n", stdout)

	stdout, _, code = runCall(t, []string{"BOXRT_CONTROL_TOKEN=" + token}, "", "__ping", "--url", url)
	assert.Equal(t, 0, code, "token from the environment")
	assert.Equal(t, "{}\n", stdout)

	stdout, _, code = runCall(t, nil, "", "__ping", "--url", url)
	assert.Equal(t, 1, code, "no token")
	ce := decodeCallError(t, stdout)
	assert.Equal(t, "BoxRuntimeUnavailableError", ce.Error.Type)
	assert.False(t, ce.Error.Retryable, "a refused token is not worth retrying")
	assert.Contains(t, ce.Error.Message, "401")
	assert.NotContains(t, stdout, token)
}

func TestCallSpawn(t *testing.T) {
	t.Run("ping", func(t *testing.T) {
		stdout, stderr, code := runCall(t, nil, "", "__ping", "--spawn")
		assert.Equal(t, 0, code, "stderr: %s", stderr)
		assert.Equal(t, "{}\n", stdout)
		assert.Empty(t, stderr, "the child's log is shown only on failure")
	})

	t.Run("typed error and the child's log on failure", func(t *testing.T) {
		stdout, stderr, code := runCall(t, nil, "", "box_get_session", `{"session_id":"nope"}`, "--spawn")
		assert.Equal(t, 1, code)
		assert.Equal(t, "BoxSessionNotFoundError", decodeCallError(t, stdout).Error.Type)
		assert.Contains(t, stderr, "boxrt serving")
	})

	t.Run("spawn-cmd with quoting", func(t *testing.T) {
		stdout, stderr, code := runCall(t, nil, "", "__ping", "--spawn-cmd", binPath+` serve --stdio --listen '' --log-level "warn"`)
		assert.Equal(t, 0, code, "stderr: %s", stderr)
		assert.Equal(t, "{}\n", stdout)
	})

	t.Run("a child that cannot start: its words are in the error", func(t *testing.T) {
		stdout, _, code := runCall(t, nil, "", "__ping", "--spawn-cmd", binPath+" serve --stdio --no-such-flag")
		assert.Equal(t, 1, code)
		ce := decodeCallError(t, stdout)
		assert.Equal(t, "BoxRuntimeUnavailableError", ce.Error.Type)
		assert.Contains(t, ce.Error.Message, "no-such-flag")
	})
}

func TestCallUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no method", []string{"--spawn"}, "missing METHOD"},
		{"both targets", []string{"__ping", "--spawn", "--url", "ws://127.0.0.1:1"}, "not both"},
		{"params not JSON", []string{"__ping", "{nope", "--spawn"}, "not valid JSON"},
		{"params not structured", []string{"__ping", "42", "--spawn"}, "object or array"},
		{"unknown flag", []string{"__ping", "--spawn", "--bogus"}, "bogus"},
		{"too many args", []string{"__ping", "{}", "extra", "--spawn"}, "too many arguments"},
		{"bad spawn-cmd", []string{"__ping", "--spawn-cmd", "boxrt 'serve"}, "unterminated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runCall(t, nil, "", tt.args...)
			assert.Equal(t, 2, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tt.want)
		})
	}
}

func TestCallHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"__ping", "--help"}, {"box_exec", "{}", "-h"}} {
		stdout, _, code := runCall(t, nil, "", args...)
		assert.Equal(t, 0, code, "%v", args)
		for _, s := range []string{"METHOD [PARAMS_JSON|-]", "--url", "--spawn", "--token-file", "--timeout", "Examples:"} {
			assert.Contains(t, stdout, s, "%v", args)
		}
	}
}
