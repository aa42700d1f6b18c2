package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBurstQueued fires 300 execs over 100 bwrap sessions at once on one
// connection, as a host fanning out tool calls does: more than run at
// once (128), so the rest wait in the connection's queue, and every one
// is answered with its command's output. The queue wait is in /metrics.
func TestBurstQueued(t *testing.T) {
	const token = "burst-test-control-token-0123456789"
	p := Start(t, Options{Stdio: true, Config: `{"backend":"bwrap","limits":{"max_sessions":100}}`, Env: []string{"BOXRT_CONTROL_TOKEN=" + token}})
	const sessions, calls = 100, 300
	var batch bytes.Buffer
	for i := range calls {
		fmt.Fprintf(&batch, `{"jsonrpc":"2.0","id":%d,"method":"box_exec","params":{"session_id":"b%d","cmd":"echo %d"}}`+"\n", i, i%sessions, i)
	}
	p.Send(batch.Bytes())
	seen := map[int]bool{}
	for range calls {
		var r Response
		require.NoError(t, json.Unmarshal(p.NextLine(3*time.Minute), &r))
		require.Nil(t, r.Error, "call %s refused: %+v", r.ID, r.Error)
		id, err := strconv.Atoi(string(r.ID))
		require.NoError(t, err)
		var res struct {
			Stdout   string `json:"stdout"`
			ExitCode int    `json:"exit_code"`
		}
		require.NoError(t, json.Unmarshal(r.Result, &res))
		assert.Equal(t, fmt.Sprintf("%d\n", id), res.Stdout)
		seen[id] = true
	}
	assert.Len(t, seen, calls, "every call answered once")

	text := scrape(t, p.Addr, token)
	n, err := strconv.Atoi(metricValue(t, text, "boxrt_rpc_queue_wait_seconds_count"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, calls, "every call's queue wait is observed")
}

// TestBurstFairAcrossSessions: a session with 140 execs queued does not
// hold up another session's exec sent after them: it runs in the next
// free slot, while the busy session's backlog still waits.
func TestBurstFairAcrossSessions(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: bwrapConfig})
	p.MustCall("box_create_session", map[string]any{"session_id": "busy"}, nil)
	p.MustCall("box_create_session", map[string]any{"session_id": "other"}, nil)
	var batch bytes.Buffer
	for i := range 140 {
		fmt.Fprintf(&batch, `{"jsonrpc":"2.0","id":%d,"method":"box_exec","params":{"session_id":"busy","cmd":"sleep 0.05"}}`+"\n", 1000+i)
	}
	batch.WriteString(`{"jsonrpc":"2.0","id":"other","method":"box_exec","params":{"session_id":"other","cmd":"echo other"}}` + "\n")
	p.Send(batch.Bytes())
	before := 0
	for range 141 {
		var r Response
		require.NoError(t, json.Unmarshal(p.NextLine(2*time.Minute), &r))
		require.Nil(t, r.Error, "%+v", r.Error)
		if string(r.ID) == `"other"` {
			break
		}
		before++
	}
	assert.Less(t, before, 20, "the other session's exec waited for the busy session's backlog")
	for range 140 - before {
		var r Response
		require.NoError(t, json.Unmarshal(p.NextLine(2*time.Minute), &r))
		require.Nil(t, r.Error, "%+v", r.Error)
	}
}

// TestBurstBackPressure: a host that writes 100,000 requests and reads no
// answer. boxrt queues what its bound allows, refuses the rest with a
// retryable BoxCapacityExceededError saying when to retry, and once the
// answers it owes fill the pipe it stops reading: the host's writes block,
// boxrt's memory stays bounded. When the host reads again, every request
// is answered.
func TestBurstBackPressure(t *testing.T) {
	state := t.TempDir()
	cmd := exec.Command(binPath, "serve", "--stdio", "--listen", "", "--state-dir", state)
	cmd.Env = append(os.Environ(), "BOXRT_CONFIG="+bwrapConfig)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("boxrt stderr:\n%s", lastLines(stderr.String(), 40))
		}
	})

	// boxrt's footprint once it serves (the race build's is large).
	_, err = fmt.Fprintln(stdin, `{"jsonrpc":"2.0","id":"first","method":"box_list_sessions","params":{}}`)
	require.NoError(t, err)
	first := bufio.NewReader(stdout)
	_, err = first.ReadBytes('\n')
	require.NoError(t, err)
	base := vmHWM(t, cmd.Process.Pid)

	const total = 100_000
	var written atomic.Int64
	go func() {
		w := bufio.NewWriterSize(stdin, 4096)
		for i := range total {
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%d,"method":"box_get_session","params":{"session_id":"s%d"}}`+"\n", i, i%64)
			if w.Buffered() > 0 && i%32 == 31 {
				if w.Flush() != nil {
					return
				}
			}
			written.Store(int64(i + 1))
		}
		_ = w.Flush()
		written.Store(total + 1) // all flushed
	}()

	// Wait until the writer stalls: boxrt stopped reading.
	last, still := int64(-1), 0
	deadline := time.Now().Add(time.Minute)
	for still < 5 {
		require.True(t, time.Now().Before(deadline), "the host's writes never stalled")
		time.Sleep(200 * time.Millisecond)
		n := written.Load()
		if n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	assert.Less(t, last, int64(total), "boxrt stopped reading while its answers were not read")
	rss := vmHWM(t, cmd.Process.Pid)
	t.Logf("writer stalled after %d requests; boxrt VmHWM %d KiB, %d KiB before", last, rss, base)
	// The queue's 4096 requests and 256 KiB of answers, under the race
	// detector's shadow memory; unbounded, 100,000 requests would take
	// several times this.
	assert.Less(t, rss-base, int64(64<<10), "boxrt's memory is bounded while the host does not read")

	sc := bufio.NewScanner(first)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var notFound, refused int
	for range total {
		require.True(t, sc.Scan(), "answer expected: %v", sc.Err())
		var r Response
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		require.NotNil(t, r.Error, string(sc.Bytes()))
		switch r.Error.Type() {
		case "BoxSessionNotFoundError":
			notFound++
		case "BoxCapacityExceededError":
			refused++
			assert.Equal(t, true, r.Error.Data["retryable"])
			assert.Equal(t, "max_queued_requests", r.Error.Data["limit"])
			assert.Greater(t, r.Error.Data["retry_after_ms"], float64(0))
		default:
			t.Fatalf("unexpected answer %s", sc.Bytes())
		}
	}
	t.Logf("%d answered, %d refused (queue full)", notFound, refused)
	assert.Positive(t, refused, "the queue filled while nothing was read")
	assert.Positive(t, notFound)
	assert.Equal(t, int64(total+1), written.Load())
}
