package test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/reconnect"
)

// outputNote is a box_exec_output notification's params and when it
// arrived.
type outputNote struct {
	reconnect.OutputParams
	at time.Time
}

// bytes is the chunk's data, decoded as reconnect decodes it.
func (n outputNote) bytes(t *testing.T) []byte {
	out := n.Output()
	require.NoError(t, out.Err)
	return out.Data
}

// liveConn is a JSON-RPC connection (stdio or WebSocket) that keeps every
// box_exec_output notification, which the plain harness clients drop.
type liveConn struct {
	t     *testing.T
	send  func([]byte)
	mu    sync.Mutex
	next  int
	wait  map[string]chan Response
	notes chan outputNote
}

func newLiveConn(t *testing.T, send func([]byte)) *liveConn {
	return &liveConn{t: t, send: send, wait: map[string]chan Response{}, notes: make(chan outputNote, 1<<16)}
}

// frame routes one incoming message.
func (c *liveConn) frame(b []byte) {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(b, &m) != nil {
		return
	}
	if m.Method == "box_exec_output" {
		var n outputNote
		if json.Unmarshal(m.Params, &n) == nil {
			n.at = time.Now()
			c.notes <- n
		}
		return
	}
	var r Response
	if json.Unmarshal(b, &r) != nil {
		return
	}
	c.mu.Lock()
	ch := c.wait[string(r.ID)]
	delete(c.wait, string(r.ID))
	c.mu.Unlock()
	if ch != nil {
		ch <- r
	}
}

// start sends a request and returns its id and where its response comes.
func (c *liveConn) start(method string, params any) (int, chan Response) {
	c.mu.Lock()
	c.next++
	id := c.next + 1000 // apart from the harness's own ids
	ch := make(chan Response, 1)
	c.wait[fmt.Sprint(id)] = ch
	c.mu.Unlock()
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	require.NoError(c.t, err)
	c.send(b)
	return id, ch
}

func (c *liveConn) await(ch chan Response, method string) Response {
	c.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(3 * time.Minute):
		c.t.Fatalf("%s: no response", method)
	}
	return Response{}
}

func (c *liveConn) call(method string, params any, result any) {
	c.t.Helper()
	_, ch := c.start(method, params)
	r := c.await(ch, method)
	require.Nil(c.t, r.Error, "%s: %+v", method, r.Error)
	if result != nil {
		require.NoError(c.t, json.Unmarshal(r.Result, result))
	}
}

func (c *liveConn) cancel(id int) {
	c.send([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":%d}}`, id)))
}

// collect reads notes of execID until its EOF note.
func (c *liveConn) collect(execID string, timeout time.Duration) []outputNote {
	c.t.Helper()
	var out []outputNote
	deadline := time.After(timeout)
	for {
		select {
		case n := <-c.notes:
			if n.ExecID != execID {
				continue
			}
			if n.EOF {
				return out
			}
			out = append(out, n)
		case <-deadline:
			c.t.Fatalf("exec %s: no end of output within %v (%d notes)", execID, timeout, len(out))
		}
	}
}

// stdoutOf joins the stdout notes, checking that seqs increase and the
// offsets leave no gap.
func stdoutOf(t *testing.T, notes []outputNote) []byte {
	var buf bytes.Buffer
	last := int64(-1)
	for _, n := range notes {
		require.Greater(t, n.Seq, last, "seq order")
		last = n.Seq
		if n.Stream != "stdout" {
			continue
		}
		require.Equal(t, int64(buf.Len()), n.Offset, "stdout offset of seq %d", n.Seq)
		buf.Write(n.bytes(t))
	}
	return buf.Bytes()
}

// stdioLive connects a liveConn to a stdio boxrt.
func stdioLive(t *testing.T, p *Proc) *liveConn {
	c := newLiveConn(t, func(b []byte) { p.Send(append(b, '\n')) })
	go func() {
		for l := range p.lines {
			c.frame(l)
		}
	}()
	return c
}

// wsLive dials /rpc/ws of a WebSocket boxrt.
func wsLive(t *testing.T, p *Proc) *liveConn {
	w := DialWS(t, p.Addr, p.Token)
	c := newLiveConn(t, func(b []byte) { w.Send(b) })
	go func() {
		for {
			_, data, err := w.C.Read(context.Background())
			if err != nil {
				return
			}
			c.frame(data)
		}
	}()
	return c
}

type liveEnv struct {
	backend string
	p       *Proc
	c       *liveConn
	dial    func() *liveConn // another connection (WebSocket only)
}

func newLiveEnv(t *testing.T, backend, transport string) *liveEnv {
	cfg := "{" + backendConfigs[backend] + `,"limits":{"session_ttl_sec":300}}`
	if transport == "stdio" {
		p := Start(t, Options{Stdio: true, Config: cfg})
		return &liveEnv{backend: backend, p: p, c: stdioLive(t, p)}
	}
	p := Start(t, Options{Config: cfg})
	return &liveEnv{backend: backend, p: p, c: wsLive(t, p), dial: func() *liveConn { return wsLive(t, p) }}
}

func (e *liveEnv) session(t *testing.T, sid string, extra map[string]any) map[string]any {
	params := map[string]any{"session_id": sid}
	for k, v := range extra {
		params[k] = v
	}
	e.c.call("box_create_session", params, nil)
	t.Cleanup(func() { e.c.start("box_delete_session", map[string]any{"session_id": sid}) })
	return params
}

func with(base map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func eachLive(t *testing.T, f func(t *testing.T, e *liveEnv)) {
	for _, backend := range []string{"bwrap", "docker"} {
		for _, transport := range []string{"stdio", "ws"} {
			t.Run(backend+"/"+transport, func(t *testing.T) { f(t, newLiveEnv(t, backend, transport)) })
		}
	}
}

// TestExecStreamArrivesEarly: the first chunk of a command that prints,
// sleeps 2 s and prints arrives well before the end; a host that did not
// ask for streaming gets no notification; the result is unchanged.
func TestExecStreamArrivesEarly(t *testing.T) {
	eachLive(t, func(t *testing.T, e *liveEnv) {
		s := e.session(t, "stream-early", nil)
		var plain ExecResult
		e.c.call("box_exec", with(s, "cmd", "echo quiet"), &plain)
		assert.Equal(t, "quiet\n", plain.Stdout)
		select {
		case n := <-e.c.notes:
			t.Fatalf("a plain box_exec sent a notification: %+v", n)
		case <-time.After(200 * time.Millisecond):
		}

		sent := time.Now()
		id, ch := e.c.start("box_exec", with(s, "cmd", "echo first; sleep 2; echo second >&2; echo third", "stream", true))
		var first outputNote
		select {
		case first = <-e.c.notes:
		case <-time.After(10 * time.Second):
			t.Fatal("no chunk")
		}
		assert.Less(t, first.at.Sub(sent), 1500*time.Millisecond, "first chunk after %v", first.at.Sub(sent))
		assert.Equal(t, "first\n", *first.Data)
		assert.Equal(t, fmt.Sprint(id), string(first.RequestID))
		rest := e.c.collect(first.ExecID, time.Minute)
		r := e.c.await(ch, "box_exec")
		require.Nil(t, r.Error)
		var res ExecResult
		require.NoError(t, json.Unmarshal(r.Result, &res))
		assert.Equal(t, "completed", res.Status)
		assert.Equal(t, "first\nthird\n", res.Stdout)
		all := append([]outputNote{first}, rest...)
		assert.Equal(t, "first\nthird\n", string(stdoutOf(t, all)))
		var stderr string
		for _, n := range all {
			if n.Stream == "stderr" {
				stderr += *n.Data
			}
		}
		assert.Equal(t, "second\n", stderr)
		assert.GreaterOrEqual(t, time.Since(sent), 2*time.Second)
	})
}

// TestExecStreamLarge: 20 MiB streamed arrive complete and in order.
func TestExecStreamLarge(t *testing.T) {
	const size = 20 << 20
	line := "0123456789abcdefghijklmnopqrstuvwxyz\n"
	want := bytes.Repeat([]byte(line), size/len(line)+1)[:size]
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			e := newLiveEnv(t, backend, "ws")
			s := e.session(t, "stream-large", nil)
			_, ch := e.c.start("box_exec", with(s, "cmd", fmt.Sprintf("yes %s | head -c %d", strings.TrimSpace(line), size), "stream", true, "timeout_sec", 300))
			var n outputNote
			select {
			case n = <-e.c.notes:
			case <-time.After(time.Minute):
				t.Fatal("no chunk")
			}
			notes := append([]outputNote{n}, e.c.collect(n.ExecID, 5*time.Minute)...)
			got := stdoutOf(t, notes)
			require.Equal(t, len(want), len(got))
			require.True(t, bytes.Equal(want, got), "streamed bytes differ from the command's")
			for _, n := range notes {
				assert.LessOrEqual(t, len(n.bytes(t)), 64<<10, "chunks are at most 64 KiB")
			}
			r := e.c.await(ch, "box_exec")
			require.Nil(t, r.Error)
			var res ExecResult
			require.NoError(t, json.Unmarshal(r.Result, &res))
			assert.Equal(t, int64(size), res.StdoutBytes)
			assert.True(t, res.StdoutTruncated, "the result keeps its head+tail bound")
		})
	}
}

// TestExecStdin: a background exec's stdin, as text and as base64.
func TestExecStdin(t *testing.T) {
	cases := []struct {
		name, cmd, image string
		writes           []map[string]any
		want             string
	}{
		{name: "cat", cmd: "cat", writes: []map[string]any{{"data": "hello\n"}, {"data_base64": base64.StdEncoding.EncodeToString([]byte{0xff, '\n'}), "eof": true}}, want: "hello\n\xff\n"},
		{name: "python-input", cmd: `python3 -c 'print(input().upper())'`, image: "boxrt-sandbox:latest", writes: []map[string]any{{"data": "round trip\n", "eof": true}}, want: "ROUND TRIP\n"},
	}
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			e := newLiveEnv(t, backend, "stdio")
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					extra := map[string]any{}
					if backend == "docker" && tc.image != "" {
						extra["image"] = tc.image
					}
					s := e.session(t, "stdin-"+tc.name, extra)
					var info struct {
						ExecID string `json:"exec_id"`
						Stdin  bool   `json:"stdin"`
					}
					e.c.call("box_exec_start", with(s, "cmd", tc.cmd, "stdin", true), &info)
					require.True(t, info.Stdin)
					for _, w := range tc.writes {
						e.c.call("box_exec_write_stdin", with(w, "exec_id", info.ExecID), nil)
					}
					var res ExecResult
					e.c.call("box_exec_wait", map[string]any{"exec_id": info.ExecID, "timeout_sec": 60}, &res)
					assert.Equal(t, "completed", res.Status, res.Stderr)
					assert.Equal(t, strings.ToValidUTF8(tc.want, "\uFFFD"), res.Stdout)
				})
			}
		})
	}
}

// TestExecPTY: a command on a terminal sees one, of the size asked, and a
// resize.
func TestExecPTY(t *testing.T) {
	eachLive(t, func(t *testing.T, e *liveEnv) {
		res := e.ptyResize(t, e.session(t, "pty", nil))
		assert.Equal(t, 0, *res.ExitCode, res.Stdout)
		assert.NotContains(t, res.Stdout, "not a tty")
	})
}

// ptyResize runs a command on a 30x100 terminal in session s, resizes it to
// 40x120 once the command has printed its size, types a line, and checks
// the command saw a terminal, both sizes and the line.
func (e *liveEnv) ptyResize(t *testing.T, s map[string]any) ExecResult {
	t.Helper()
	var info struct {
		ExecID string `json:"exec_id"`
	}
	e.c.call("box_exec_start", with(s, "cmd", "tty; stty size; read line; stty size; echo got $line",
		"pty", map[string]any{"rows": 30, "cols": 100}, "stream", true), &info)
	var seen string
	for !strings.Contains(seen, "30 100") {
		select {
		case n := <-e.c.notes:
			seen += string(n.bytes(t))
		case <-time.After(30 * time.Second):
			t.Fatalf("no size line; got %q", seen)
		}
	}
	e.c.call("box_exec_resize", map[string]any{"exec_id": info.ExecID, "rows": 40, "cols": 120}, nil)
	e.c.call("box_exec_write_stdin", map[string]any{"exec_id": info.ExecID, "data": "typed\r"}, nil)
	var res ExecResult
	e.c.call("box_exec_wait", map[string]any{"exec_id": info.ExecID, "timeout_sec": 60}, &res)
	assert.Equal(t, "completed", res.Status)
	assert.Regexp(t, `^/dev/\S+\r\n30 100\r\n`, res.Stdout)
	assert.Contains(t, res.Stdout, "40 120\r\ngot typed")
	return res
}

// hostHas reports whether a process whose command line contains marker
// runs on this machine (sandboxes of both backends are visible from here).
func hostHas(marker string) bool {
	return exec.Command("pgrep", "-f", marker).Run() == nil
}

// TestExecKillTree: box_exec_kill ends the whole tree, a child that
// ignores TERM included.
func TestExecKillTree(t *testing.T) {
	cases := []struct {
		signal string
		status string
	}{
		{signal: "", status: "canceled"},
		{signal: "TERM", status: ""}, // the shell dies of TERM itself, or the grace runs out
	}
	for bi, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			e := newLiveEnv(t, backend, "stdio")
			s := e.session(t, "kill", nil)
			for i, tc := range cases {
				t.Run("signal="+tc.signal, func(t *testing.T) {
					marker := fmt.Sprintf("sleep 97%d%d", bi, i)
					var info struct {
						ExecID string `json:"exec_id"`
					}
					e.c.call("box_exec_start", with(s, "cmd", fmt.Sprintf("(trap '' TERM; exec %s) & %s1; wait", marker, marker)), &info)
					require.Eventually(t, func() bool { return hostHas(marker+" ") || hostHas(marker+"1") }, 10*time.Second, 50*time.Millisecond)
					var killed struct {
						Status string `json:"status"`
					}
					e.c.call("box_exec_kill", map[string]any{"exec_id": info.ExecID, "signal": tc.signal}, &killed)
					if tc.status != "" {
						assert.Equal(t, tc.status, killed.Status)
					}
					assert.Eventually(t, func() bool { return !hostHas(marker) }, 5*time.Second, 50*time.Millisecond, "the TERM-proof child survived")
					var list struct {
						Execs []struct {
							ExecID string `json:"exec_id"`
							Status string `json:"status"`
						} `json:"execs"`
					}
					e.c.call("box_exec_list", map[string]any{"session_id": "kill"}, &list)
					found := false
					for _, x := range list.Execs {
						if x.ExecID == info.ExecID {
							found = true
							assert.NotEqual(t, "running", x.Status)
						}
					}
					assert.True(t, found, "a finished exec is still listed")
				})
			}
		})
	}
}

// TestExecCancelKeepsSession: $/cancelRequest of a running box_exec kills
// the command, answers status canceled, and keeps the session's files.
func TestExecCancelKeepsSession(t *testing.T) {
	eachLive(t, func(t *testing.T, e *liveEnv) {
		s := e.session(t, "cancel", nil)
		id, ch := e.c.start("box_exec", with(s, "cmd", "echo kept > /workspace/before; echo started; sleep 60", "stream", true))
		select {
		case <-e.c.notes:
		case <-time.After(30 * time.Second):
			t.Fatal("no output")
		}
		sent := time.Now()
		e.c.cancel(id)
		r := e.c.await(ch, "box_exec")
		require.Nil(t, r.Error)
		assert.Less(t, time.Since(sent), 20*time.Second)
		var res ExecResult
		require.NoError(t, json.Unmarshal(r.Result, &res))
		assert.Equal(t, "canceled", res.Status)
		assert.Nil(t, res.ExitCode)
		assert.Equal(t, "started\n", res.Stdout)
		var after ExecResult
		e.c.call("box_exec", with(s, "cmd", "cat /workspace/before"), &after)
		assert.Equal(t, "kept\n", after.Stdout)
	})
}

// TestExecReattach: a host that reconnects re-attaches to a running exec
// and gets the replay, with what the bounded buffer dropped counted.
func TestExecReattach(t *testing.T) {
	cases := []struct {
		name    string
		bytes   int
		dropped bool
	}{
		{name: "within-bound", bytes: 100 << 10},
		{name: "over-bound", bytes: 3 << 20, dropped: true},
	}
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			e := newLiveEnv(t, backend, "ws")
			s := e.session(t, "reattach", nil)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					first := e.dial()
					var info struct {
						ExecID string `json:"exec_id"`
					}
					first.call("box_exec_start", with(s, "cmd", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo; read line; echo after $line", tc.bytes), "stdin", true), &info)
					// Wait until the output is out, then the first host goes.
					require.Eventually(t, func() bool {
						var r ExecResult
						first.call("box_exec_wait", map[string]any{"exec_id": info.ExecID, "timeout_sec": 0.01}, &r)
						return r.StdoutBytes == int64(tc.bytes+1)
					}, 30*time.Second, 50*time.Millisecond)

					second := e.dial()
					var att struct {
						ExecID        string `json:"exec_id"`
						Status        string `json:"status"`
						FirstSeq      int64  `json:"first_seq"`
						DroppedChunks int64  `json:"dropped_chunks"`
						DroppedBytes  int64  `json:"dropped_bytes"`
					}
					second.call("box_exec_attach", map[string]any{"exec_id": info.ExecID}, &att)
					assert.Equal(t, "running", att.Status)
					second.call("box_exec_write_stdin", map[string]any{"exec_id": info.ExecID, "data": "reattached\n", "eof": true}, nil)
					notes := second.collect(info.ExecID, time.Minute)
					require.NotEmpty(t, notes)
					var got []byte
					for _, n := range notes {
						got = append(got, n.bytes(t)...)
					}
					if tc.dropped {
						assert.Positive(t, att.DroppedChunks)
						assert.Equal(t, att.FirstSeq, att.DroppedChunks)
						assert.Equal(t, att.DroppedBytes, notes[0].Offset, "the replay starts where the drop ends")
						assert.LessOrEqual(t, len(got), (1<<20)+(64<<10), "replay is bounded")
					} else {
						assert.Zero(t, att.DroppedChunks)
						assert.Zero(t, att.DroppedBytes)
						assert.Equal(t, int64(0), notes[0].Offset)
					}
					assert.Equal(t, int64(tc.bytes+1)+int64(len("after reattached\n")), att.DroppedBytes+int64(len(got)))
					assert.True(t, strings.HasSuffix(string(got), "x\nafter reattached\n"), "tail %q", string(got[max(0, len(got)-40):]))
				})
			}
		})
	}
}

// TestExecBackgroundLimits: the per-session limit names itself, deleting
// the session kills its execs and a late wait still gets the outcome.
func TestExecBackgroundLimits(t *testing.T) {
	e := newLiveEnv(t, "bwrap", "stdio")
	s := e.session(t, "limits", nil)
	var ids []string
	for i := 0; i < 16; i++ {
		var info struct {
			ExecID string `json:"exec_id"`
		}
		e.c.call("box_exec_start", with(s, "cmd", "sleep 60"), &info)
		ids = append(ids, info.ExecID)
	}
	_, ch := e.c.start("box_exec_start", with(s, "cmd", "sleep 60"))
	r := e.c.await(ch, "box_exec_start")
	require.NotNil(t, r.Error)
	assert.Equal(t, "BoxCapacityExceededError", r.Error.Type())
	assert.Equal(t, "max_background_execs", r.Error.Data["limit"])

	// A foreground exec is not held up by the background ones.
	var fg ExecResult
	e.c.call("box_exec", with(s, "cmd", "echo fg"), &fg)
	assert.Equal(t, "fg\n", fg.Stdout)

	e.c.call("box_delete_session", map[string]any{"session_id": "limits"}, nil)
	_, ch = e.c.start("box_exec_wait", map[string]any{"exec_id": ids[0]})
	r = e.c.await(ch, "box_exec_wait")
	require.NotNil(t, r.Error)
	assert.Equal(t, "BoxSessionNotFoundError", r.Error.Type())

	_, ch = e.c.start("box_exec_wait", map[string]any{"exec_id": "x-unknown"})
	r = e.c.await(ch, "box_exec_wait")
	require.NotNil(t, r.Error)
	assert.Equal(t, "BoxValidationError", r.Error.Type())
	assert.Equal(t, "exec_id", r.Error.Data["field"])
}

// TestCallStreams: boxrt call prints streamed output on stderr as it
// arrives (raw or as JSON lines) and keeps stdout for the result; for
// box_exec_start it follows the output to the exec's end.
func TestCallStreams(t *testing.T) {
	env := []string{`BOXRT_CONFIG={"backend":"bwrap"}`}
	cases := []struct {
		name, method, format string
		check                func(t *testing.T, stdout, stderr string)
	}{
		{name: "box_exec raw", method: "box_exec", format: "raw", check: func(t *testing.T, stdout, stderr string) {
			assert.Equal(t, "one\ntwo\n", stderr)
			var res ExecResult
			require.NoError(t, json.Unmarshal([]byte(stdout), &res))
			assert.Equal(t, "one\ntwo\n", res.Stdout)
		}},
		{name: "box_exec_start jsonl", method: "box_exec_start", format: "jsonl", check: func(t *testing.T, stdout, stderr string) {
			var info struct {
				ExecID string `json:"exec_id"`
			}
			require.NoError(t, json.Unmarshal([]byte(stdout), &info))
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			require.Len(t, lines, 3, stderr)
			var last map[string]any
			require.NoError(t, json.Unmarshal([]byte(lines[2]), &last))
			assert.Equal(t, true, last["eof"])
			assert.Equal(t, info.ExecID, last["exec_id"])
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runCall(t, env, "", tc.method,
				`{"session_id":"call-stream","cmd":"echo one; sleep 0.3; echo two","stream":true}`,
				"--stream-format", tc.format, "--spawn-cmd", binPath+` serve --stdio --listen '' --log-level warn`)
			require.Equal(t, 0, code, "stdout: %s stderr: %s", stdout, stderr)
			tc.check(t, stdout, stderr)
		})
	}
}
