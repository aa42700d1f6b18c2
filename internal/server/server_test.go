package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/statelock"
	"github.com/boxrt/boxrt/runtime"
)

// A stdio server with a listener answers on stdin, serves the health and
// metrics routes (the metrics behind the token), stops when stdin closes,
// and Close gives the state directory back.
func TestStdioServerLifecycle(t *testing.T) {
	cfg := runtime.DefaultConfig()
	cfg.Backend = actions.HostBackend
	stateDir := t.TempDir()
	stdin, toServer := io.Pipe()
	fromServer, stdout := io.Pipe()
	token := strings.Repeat("t", 40)
	s, err := New(context.Background(), Options{
		Version: "test", Config: cfg, StateDir: stateDir, Token: token, Listen: "127.0.0.1:0",
		Protocol: JSONRPC, Stdio: true, Stdin: stdin, Stdout: stdout, Stderr: io.Discard,
		Trust: actions.NewTrust("", true), Keepalive: time.Minute, Log: zerolog.Nop(), LogDropped: func() uint64 { return 0 },
	})
	require.NoError(t, err)
	_, err = statelock.Acquire(stateDir)
	require.Error(t, err, "the state directory is held while the server lives")

	ran := make(chan struct{})
	go func() {
		s.Run(context.Background())
		close(ran)
	}()
	_, err = io.WriteString(toServer, `{"jsonrpc":"2.0","id":1,"method":"__ping","params":{}}`+"\n")
	require.NoError(t, err)
	line, err := bufio.NewReader(fromServer).ReadBytes('\n')
	require.NoError(t, err)
	var answer struct {
		ID     int             `json:"id"`
		Result json.RawMessage `json:"result"`
	}
	require.NoError(t, json.Unmarshal(line, &answer))
	assert.Equal(t, 1, answer.ID)

	assert.Equal(t, http.StatusOK, get(t, s.url+"/healthz", ""))
	assert.Equal(t, http.StatusUnauthorized, get(t, s.url+"/metrics", ""))
	assert.Equal(t, http.StatusOK, get(t, s.url+"/metrics", token))
	assert.Equal(t, http.StatusNotFound, get(t, s.url+"/rpc/ws", token), "stdio is the control channel")

	require.NoError(t, toServer.Close())
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return when stdin closed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	require.NoError(t, s.Close(ctx))
	lock, err := statelock.Acquire(stateDir)
	require.NoError(t, err, "Close releases the state directory")
	require.NoError(t, lock.Release())
}

func get(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}

// A server that cannot start gives back what it took: the state
// directory is free for the next attempt.
func TestNewFailureReleasesStateDir(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	stateDir := t.TempDir()
	_, err = New(context.Background(), Options{
		Config: runtime.DefaultConfig(), StateDir: stateDir, Token: strings.Repeat("t", 40), Listen: busy.Addr().String(),
		Protocol: JSONRPC, Log: zerolog.Nop(),
	})
	require.ErrorContains(t, err, "cannot listen on "+busy.Addr().String())
	lock, err := statelock.Acquire(stateDir)
	require.NoError(t, err)
	require.NoError(t, lock.Release())
}
