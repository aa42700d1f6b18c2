package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A host that pipes boxrt's stderr and never reads it must still get every
// answer: logging drops (and counts) lines instead of blocking the request
// handlers once the pipe is full. Then, when the host starts reading, one
// line reports how many were dropped, the metric has counted them, and a
// normal shutdown still writes its last lines.
func TestUndrainedStderrNeverStallsTheProtocol(t *testing.T) {
	const calls = 3000
	addr := freeAddr(t)
	cmd := exec.Command(binPath, "serve", "--stdio", "--listen", addr, "--state-dir", t.TempDir(), "--log-level", "debug")
	cmd.Env = append(os.Environ(), "BOXRT_CONFIG="+bwrapConfig, "BOXRT_CONTROL_TOKEN=", "LANGBOT_BOX_CONTROL_TOKEN=")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr, err := cmd.StderrPipe() // not read until the answers are in
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	// stderr is read only once startReading is closed: by the test, when
	// the host "starts reading", or by the cleanup.
	var stderrSeen syncBuffer
	startReading, stderrRead := make(chan struct{}), make(chan struct{})
	var startOnce sync.Once
	startStderr := func() { startOnce.Do(func() { close(startReading) }) }
	go func() {
		defer close(stderrRead)
		<-startReading
		_, _ = io.Copy(&stderrSeen, stderr)
	}()
	answers := make(chan Response, calls+16)
	stdoutRead := make(chan struct{})
	go func() {
		defer close(stdoutRead)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r Response
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				select {
				case answers <- r:
				default: // the test stopped listening
				}
			}
		}
	}()
	go func() {
		// os/exec: read both pipes to EOF before Wait.
		<-stdoutRead
		<-stderrRead
		_ = cmd.Wait()
		close(exited)
	}()
	defer func() {
		startStderr()
		_ = stdin.Close()
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("boxrt stderr (as read):\n%s", lastLines(stderrSeen.String(), 30))
		}
	}()

	// Every request at once, as a host that pipelines: each one is answered
	// (not found, after waiting its turn in the queue) and logged.
	var reqs bytes.Buffer
	for i := 1; i <= calls; i++ {
		fmt.Fprintf(&reqs, `{"jsonrpc":"2.0","id":%d,"method":"box_get_session","params":{"session_id":"missing-%d"}}`+"\n", i, i)
	}
	writeErr := make(chan error, 1)
	go func() { _, err := stdin.Write(reqs.Bytes()); writeErr <- err }()

	got := map[int]bool{}
	types := map[string]int{}
	deadline := time.After(time.Minute)
	for len(got) < calls {
		select {
		case r := <-answers:
			id, err := strconv.Atoi(string(r.ID))
			require.NoError(t, err, "answer id %s", r.ID)
			require.False(t, got[id], "id %d answered twice", id)
			got[id] = true
			require.NotNil(t, r.Error, "id %d: a missing session is an error", id)
			types[r.Error.Type()]++
		case <-exited:
			t.Fatalf("boxrt exited after %d of %d answers", len(got), calls)
		case <-deadline:
			t.Fatalf("only %d of %d answers arrived: the protocol stalled behind stderr", len(got), calls)
		}
	}
	require.NoError(t, <-writeErr)
	t.Logf("all %d answers arrived: %v", calls, types)
	for typ := range types {
		assert.Contains(t, []string{"BoxSessionNotFoundError", "BoxRuntimeUnavailableError"}, typ)
	}
	assert.Positive(t, types["BoxSessionNotFoundError"])

	// The metric counts the dropped lines while stderr is still stuck (the
	// stdio token comes from box_health, the way a host gets it).
	health := stdioCall(t, stdin, answers, calls+1, "box_health")
	var h struct {
		RelayToken string `json:"relay_token"`
	}
	require.NoError(t, json.Unmarshal(health.Result, &h))
	dropped, err := strconv.ParseFloat(metricValue(t, scrape(t, addr, h.RelayToken), "boxrt_log_dropped_lines_total"), 64)
	require.NoError(t, err)
	t.Logf("boxrt_log_dropped_lines_total %v", dropped)
	assert.Positive(t, dropped, "a never-read pipe cannot have taken every line")

	// The host starts reading: one line reports the drop.
	startStderr()
	require.Eventually(t, func() bool {
		return strings.Contains(stderrSeen.String(), "log lines dropped: stderr was not read fast enough")
	}, 20*time.Second, 20*time.Millisecond, "the drop is reported once stderr drains")
	var reported float64
	for _, line := range strings.Split(stderrSeen.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["message"] == "log lines dropped: stderr was not read fast enough" {
			assert.Equal(t, "warn", m["level"])
			n, _ := m["dropped_lines"].(float64)
			assert.Positive(t, n)
			reported += n
		}
	}
	after, err := strconv.ParseFloat(metricValue(t, scrape(t, addr, h.RelayToken), "boxrt_log_dropped_lines_total"), 64)
	require.NoError(t, err)
	t.Logf("reported in log lines: %v; boxrt_log_dropped_lines_total now %v", reported, after)
	assert.GreaterOrEqual(t, after, dropped, "a counter")
	assert.GreaterOrEqual(t, after, reported, "the metric counts every reported drop")

	// Normal shutdown: stdin EOF, exit 0, and the last line is written.
	require.NoError(t, stdin.Close())
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("boxrt did not exit after stdin EOF")
	}
	assert.Equal(t, 0, cmd.ProcessState.ExitCode())
	assert.Contains(t, lastLines(stderrSeen.String(), 3), `"message":"boxrt stopped"`, "shutdown flushes the log")
}

// stdioCall sends one request and waits for its answer on answers.
func stdioCall(t *testing.T, stdin io.Writer, answers <-chan Response, id int, method string) Response {
	t.Helper()
	_, err := fmt.Fprintf(stdin, `{"jsonrpc":"2.0","id":%d,"method":%q,"params":{}}`+"\n", id, method)
	require.NoError(t, err)
	timeout := time.After(30 * time.Second)
	for {
		select {
		case r := <-answers:
			if string(r.ID) == strconv.Itoa(id) {
				require.Nil(t, r.Error, "%s: %+v", method, r.Error)
				return r
			}
		case <-timeout:
			t.Fatalf("%s: no answer", method)
		}
	}
}

// TestConsoleLogsWithoutColourOffATerminal: boxrt serve --log-format
// console with stderr on a pipe or a file writes plain lines, no ANSI
// escape codes.
func TestConsoleLogsWithoutColourOffATerminal(t *testing.T) {
	p := Start(t, Options{Stdio: true, Args: []string{"--log-format", "console"}})
	p.MustCall("box_health", map[string]any{}, nil)
	p.CloseStdin()
	_, _ = p.Wait(30 * time.Second)
	out := p.Stderr()
	assert.Contains(t, out, "boxrt stopped")
	assert.NotContains(t, out, "\x1b[", "escape codes in stderr: %q", lastLines(out, 5))
}
