//go:build unix

package reconnect

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// outputLog collects one stream's ExecOutput values.
type outputLog struct {
	mu   sync.Mutex
	outs []ExecOutput
	end  chan ExecOutput
}

func newOutputLog() *outputLog { return &outputLog{end: make(chan ExecOutput, 1)} }

func (o *outputLog) add(x ExecOutput) {
	if x.EOF || x.Err != nil {
		o.end <- x
		return
	}
	o.mu.Lock()
	o.outs = append(o.outs, x)
	o.mu.Unlock()
}

func (o *outputLog) text() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := ""
	for _, x := range o.outs {
		s += string(x.Data)
	}
	return s
}

func (o *outputLog) last() ExecOutput {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.outs[len(o.outs)-1]
}

func (o *outputLog) waitEnd(t *testing.T) ExecOutput {
	t.Helper()
	select {
	case x := <-o.end:
		return x
	case <-time.After(60 * time.Second):
		t.Fatal("the stream did not end")
	}
	return ExecOutput{}
}

// cut drops the proxied connections (the listener stays, so the client
// reconnects through it).
func (p *stallProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// TestRealCallStream: box_exec output arrives through CallStream before the
// result; a background exec's stream is cut with the link and re-attached
// after the reconnect, without losing output.
func TestRealCallStream(t *testing.T) {
	needRealBinary(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	addr, token := startServe(t, t.TempDir(), stderr)
	proxy := newStallProxy(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Dial(ctx, "http://"+proxy.addr(), WithToken(token), WithBackoff(100*time.Millisecond, time.Second),
		WithLogger(testLogger()))
	require.NoError(t, err)
	defer c.Close()
	requireBackend(t, c)

	fg := newOutputLog()
	var res struct {
		Stdout string `json:"stdout"`
	}
	require.NoError(t, c.CallStream(ctx, "box_exec", map[string]any{"session_id": "stream", "cmd": "echo a; echo b >&2", "stream": true}, &res, fg.add))
	assert.True(t, fg.waitEnd(t).EOF)
	assert.Equal(t, "a\n", res.Stdout)
	assert.ElementsMatch(t, []string{"a\n", "b\n"}, []string{string(fg.outs[0].Data), string(fg.outs[1].Data)})

	bg := newOutputLog()
	var info struct {
		ExecID string `json:"exec_id"`
	}
	require.NoError(t, c.CallStream(ctx, "box_exec_start", map[string]any{"session_id": "stream",
		"cmd": "echo one; read x; echo two $x", "stdin": true, "stream": true}, &info, bg.add))
	require.Eventually(t, func() bool { return bg.text() == "one\n" }, 30*time.Second, 10*time.Millisecond)
	proxy.cut()
	end := bg.waitEnd(t)
	require.Error(t, end.Err, "the stream ends with the link")
	var rerr *Error
	require.ErrorAs(t, end.Err, &rerr)
	assert.True(t, rerr.Retryable)

	require.NoError(t, c.Call(ctx, "box_exec_write_stdin", map[string]any{"exec_id": info.ExecID, "data": "again\n", "eof": true}, nil))
	again := newOutputLog()
	var att struct {
		DroppedChunks int64 `json:"dropped_chunks"`
	}
	require.NoError(t, c.CallStream(ctx, "box_exec_attach", map[string]any{"exec_id": info.ExecID, "from_seq": bg.last().Seq + 1}, &att, again.add))
	assert.True(t, again.waitEnd(t).EOF)
	assert.Zero(t, att.DroppedChunks)
	assert.Equal(t, "two again\n", again.text())
}
