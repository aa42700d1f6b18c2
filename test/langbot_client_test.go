package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
)

// This file is a LangBot host as far as the wire goes: it speaks the
// action-RPC envelope byte for byte, over a stdio child (`boxrt box -s`)
// or /rpc/ws, and holds boxrt to every framing rule the host's reader
// has (64 KiB lines, chunk offsets, sizes).

const (
	lbInstance = "instance-a"
	lbToken    = "langbot-test-control-token-0123456789abcdef"
	// hostLineLimit is the host's asyncio reader limit: a longer line
	// drops the connection.
	hostLineLimit = 64 << 10
)

// lbContext is the envelope's tenant context.
type lbContext struct {
	InstanceUUID        string `json:"instance_uuid"`
	WorkspaceUUID       string `json:"workspace_uuid"`
	PlacementGeneration int64  `json:"placement_generation"`
}

func tenant(workspace string, gen int64) *lbContext {
	return &lbContext{InstanceUUID: lbInstance, WorkspaceUUID: workspace, PlacementGeneration: gen}
}

// lbResponse is an answer exactly as the envelope carries it.
type lbResponse struct {
	SeqID       json.RawMessage `json:"seq_id"`
	Code        int             `json:"code"`
	Message     string          `json:"message"`
	Data        json.RawMessage `json:"data"`
	ChunkStatus string          `json:"chunk_status"`
	// Raw is the whole message (reassembled when chunked).
	Raw []byte `json:"-"`
	// Lines is how many physical lines carried it (1 unless chunked).
	Lines int `json:"-"`
}

// LB is one connection to a LangBot-mode boxrt.
type LB struct {
	t    *testing.T
	send func([]byte) error

	mu      sync.Mutex
	seq     int64
	waiters map[string]chan lbResponse
	// stray are answers nobody waited for, in arrival order.
	stray   chan lbResponse
	failure error // a framing rule boxrt broke
	order   []string
}

func newLB(t *testing.T, send func([]byte) error) *LB {
	return &LB{t: t, send: send, seq: 41000, waiters: map[string]chan lbResponse{}, stray: make(chan lbResponse, 256)}
}

// deliver matches an answer to its caller by seq_id.
func (c *LB) deliver(r lbResponse) {
	c.mu.Lock()
	c.order = append(c.order, string(r.SeqID))
	ch, ok := c.waiters[string(r.SeqID)]
	delete(c.waiters, string(r.SeqID))
	c.mu.Unlock()
	if ok {
		ch <- r
		return
	}
	select {
	case c.stray <- r:
	default:
	}
}

func (c *LB) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failure == nil {
		c.failure = err
	}
}

// checkFraming fails the test if boxrt broke a framing rule.
func (c *LB) checkFraming() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NoError(c.t, c.failure)
}

// request encodes a request as the host does (context omitted when nil).
func request(seq int64, action string, data any, ctx *lbContext) []byte {
	m := map[string]any{"seq_id": seq, "action": action, "data": data}
	if ctx != nil {
		m["context"] = ctx
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// Go sends a request and returns where its answer will arrive.
func (c *LB) Go(action string, data any, ctx *lbContext) (int64, chan lbResponse) {
	c.t.Helper()
	c.mu.Lock()
	c.seq++
	seq := c.seq
	ch := make(chan lbResponse, 1)
	c.waiters[strconv.FormatInt(seq, 10)] = ch
	c.mu.Unlock()
	require.NoError(c.t, c.send(request(seq, action, data, ctx)))
	return seq, ch
}

// Call sends a request and waits for its answer.
func (c *LB) Call(action string, data any, ctx *lbContext) lbResponse {
	c.t.Helper()
	_, ch := c.Go(action, data, ctx)
	return c.wait(action, ch, 3*time.Minute)
}

func (c *LB) wait(action string, ch chan lbResponse, timeout time.Duration) lbResponse {
	c.t.Helper()
	select {
	case r := <-ch:
		c.checkFraming()
		return r
	case <-time.After(timeout):
		c.checkFraming()
		c.t.Fatalf("%s: no answer within %v", action, timeout)
	}
	return lbResponse{}
}

// OK calls and decodes a successful answer's data into out.
func (c *LB) OK(action string, data any, ctx *lbContext, out any) {
	c.t.Helper()
	r := c.Call(action, data, ctx)
	require.Equal(c.t, 0, r.Code, "%s: %s", action, r.Message)
	require.Equal(c.t, "success", r.Message)
	require.Equal(c.t, "continue", r.ChunkStatus)
	if out != nil {
		require.NoError(c.t, json.Unmarshal(r.Data, out))
	}
}

// Refused calls and checks the error answer's exact shape and prefix.
func (c *LB) Refused(action string, data any, ctx *lbContext, prefix string) lbResponse {
	c.t.Helper()
	r := c.Call(action, data, ctx)
	require.Equal(c.t, 1, r.Code, "%s: expected %q, got success %s", action, prefix, r.Data)
	require.True(c.t, strings.HasPrefix(r.Message, prefix), "%s: message %q does not start with %q", action, r.Message, prefix)
	require.Equal(c.t, "{}", string(r.Data), "error answers carry data {}")
	require.Equal(c.t, "continue", r.ChunkStatus)
	return r
}

// decodeAnswer reads one whole message; it must have exactly the five
// keys.
func decodeAnswer(msg []byte, lines int) (lbResponse, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(msg, &keys); err != nil {
		return lbResponse{}, fmt.Errorf("not JSON: %w: %.200s", err, msg)
	}
	if len(keys) != 5 {
		return lbResponse{}, fmt.Errorf("answer has %d keys, want seq_id, code, message, data, chunk_status: %.300s", len(keys), msg)
	}
	var r lbResponse
	if err := json.Unmarshal(msg, &r); err != nil {
		return lbResponse{}, err
	}
	r.Raw, r.Lines = msg, lines
	return r, nil
}

// readStdio is the host's stdio reader: every physical line must stay
// under 64 KiB; chunk lines are reassembled with the offset and size
// checks of the reference.
func (c *LB) readStdio(r io.Reader) {
	br := bufio.NewReaderSize(r, 1<<20)
	var assembling bool
	var total, lines int
	var buf []byte
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && len(line) >= hostLineLimit {
			c.fail(fmt.Errorf("boxrt wrote a %d-byte line; the host's reader drops the connection at %d", len(line), hostLineLimit))
		}
		if err != nil {
			return
		}
		line = bytes.TrimSpace(line)
		var kind struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(line, &kind); err != nil {
			c.fail(fmt.Errorf("stdout line is not a JSON object: %.200q", line))
			continue
		}
		var ctl struct {
			Type      string  `json:"type"`
			TotalSize *int    `json:"total_size"`
			Data      *string `json:"data"`
			Offset    *int    `json:"offset"`
		}
		if strings.HasPrefix(kind.Type, "chunk_") {
			if err := json.Unmarshal(line, &ctl); err != nil {
				c.fail(fmt.Errorf("bad chunk line %.200q: %w", line, err))
				continue
			}
		}
		switch {
		case ctl.Type == "chunk_start":
			if assembling || ctl.TotalSize == nil {
				c.fail(fmt.Errorf("bad chunk_start %s", line))
			}
			assembling, total, lines, buf = true, *ctl.TotalSize, 1, buf[:0]
			if total <= 16384 {
				c.fail(fmt.Errorf("a %d-byte message was chunked; only those over 16384 are", total))
			}
		case ctl.Type == "chunk_data":
			lines++
			switch {
			case !assembling || ctl.Data == nil || ctl.Offset == nil:
				c.fail(fmt.Errorf("bad chunk_data %.200s", line))
			case *ctl.Offset != len(buf):
				c.fail(fmt.Errorf("chunk_data offset %d, %d bytes received", *ctl.Offset, len(buf)))
			case len(*ctl.Data) > 16384:
				c.fail(fmt.Errorf("chunk_data piece of %d bytes", len(*ctl.Data)))
			}
			if ctl.Data != nil {
				buf = append(buf, *ctl.Data...)
			}
		case ctl.Type == "chunk_end":
			lines++
			if !assembling || len(buf) != total {
				c.fail(fmt.Errorf("chunk_end after %d of %d bytes", len(buf), total))
			}
			assembling = false
			resp, err := decodeAnswer(bytes.Clone(buf), lines)
			if err != nil {
				c.fail(err)
				continue
			}
			c.deliver(resp)
		default:
			if len(line) > 16384 {
				c.fail(fmt.Errorf("a %d-byte message went unchunked", len(line)))
			}
			resp, err := decodeAnswer(bytes.Clone(line), 1)
			if err != nil {
				c.fail(err)
				continue
			}
			c.deliver(resp)
		}
	}
}

// lbProc is a `boxrt box` child.
type lbProc struct {
	*LB
	Addr   string
	State  string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncBuffer
	done   chan struct{}
}

// lbOptions start `boxrt box`.
type lbOptions struct {
	Stdio  bool
	Config string // LANGBOT_BOX_CONFIG
	Token  string // LANGBOT_BOX_CONTROL_TOKEN; "" for none
	Env    []string
}

// startBox spawns `boxrt box` as the LangBot host does.
func startBox(t *testing.T, o lbOptions) *lbProc {
	t.Helper()
	addr := freeAddr(t)
	host, port, _ := strings.Cut(addr, ":")
	state := t.TempDir()
	// Runs after the stop registered below (cleanups run last first).
	t.Cleanup(func() { reapSandboxes(t, state) })
	args := []string{"box", "--host", host, "--ws-control-port", port, "--state-dir", state, "--log-level", "debug"}
	if o.Stdio {
		args = append(args, "-s")
	}
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), "LANGBOT_BOX_TRUSTED_INSTANCE_UUID="+lbInstance, "LANGBOT_BOX_CONFIG="+o.Config)
	if o.Token != "" {
		cmd.Env = append(cmd.Env, "LANGBOT_BOX_CONTROL_TOKEN="+o.Token)
	}
	cmd.Env = append(cmd.Env, o.Env...)
	p := &lbProc{Addr: addr, State: state, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	p.stdin = stdin
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var writeMu sync.Mutex
	p.LB = newLB(t, func(b []byte) error {
		writeMu.Lock()
		defer writeMu.Unlock()
		_, err := p.stdin.Write(append(b, '\n'))
		return err
	})
	require.NoError(t, cmd.Start())
	go p.readStdio(stdout)
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.stdin.Close()
		if !o.Stdio {
			_ = cmd.Process.Signal(os.Interrupt) // stdin EOF ends the stdio mode only
		}
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("boxrt stderr:\n%s", lastLines(p.stderr.String(), 60))
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-p.done:
			t.Fatalf("boxrt box exited early: %s", p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "boxrt box did not listen: %s", p.stderr.String())
	}
	return p
}

// Raw writes bytes to the child's stdin as they are.
func (p *lbProc) Raw(b string) {
	p.t.Helper()
	_, err := io.WriteString(p.stdin, b)
	require.NoError(p.t, err)
}

// lbHeaders are the host's control headers.
func lbHeaders(instance, token string) http.Header {
	h := http.Header{}
	if instance != "" {
		h.Set("X-LangBot-Instance-Id", instance)
	}
	if token != "" {
		h.Set("X-LangBot-Box-Control-Token", token)
	}
	return h
}

// dialBox connects to /rpc/ws as the host does; it returns the HTTP
// status when the upgrade is refused.
func dialBox(t *testing.T, addr string, h http.Header) (*LB, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+addr+"/rpc/ws", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		require.NotNil(t, resp, "%v", err)
		resp.Body.Close()
		return nil, resp.StatusCode
	}
	c.SetReadLimit(32 << 20)
	lb := newLB(t, func(b []byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return c.Write(ctx, websocket.MessageText, b)
	})
	go func() {
		for {
			typ, data, err := c.Read(context.Background())
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					return
				}
				return
			}
			if typ != websocket.MessageText {
				lb.fail(fmt.Errorf("boxrt sent a binary message"))
				continue
			}
			r, err := decodeAnswer(data, 1)
			if err != nil {
				lb.fail(err)
				continue
			}
			lb.deliver(r)
		}
	}()
	t.Cleanup(func() { c.CloseNow() })
	return lb, http.StatusSwitchingProtocols
}
