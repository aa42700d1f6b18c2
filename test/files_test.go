package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/reconnect"
)

// rpcCaller is a JSON-RPC call over either transport.
type rpcCaller func(method string, params any) Response

// filesEnv is a boxrt with one session, reached over stdio or WebSocket.
type filesEnv struct {
	p     *Proc
	call  rpcCaller
	token string
}

func newFilesEnv(t *testing.T, backend, transport string) *filesEnv {
	t.Helper()
	cfg := "{" + backendConfigs[backend] + `,"limits":{"session_ttl_sec":600}}`
	if transport == "stdio" {
		p := Start(t, Options{Stdio: true, Config: cfg})
		var health struct {
			RelayToken string `json:"relay_token"`
		}
		p.MustCall("box_health", map[string]any{}, &health)
		return &filesEnv{p: p, token: health.RelayToken,
			call: func(m string, params any) Response { return p.Call(m, params, 2*time.Minute) }}
	}
	p := Start(t, Options{Config: cfg})
	require.NotEmpty(t, p.Token)
	ws := DialWS(t, p.Addr, p.Token)
	return &filesEnv{p: p, token: p.Token, call: ws.Call}
}

func (e *filesEnv) must(t *testing.T, method string, params map[string]any, out any) {
	t.Helper()
	r := e.call(method, params)
	require.Nil(t, r.Error, "%s %v: %+v", method, params, r.Error)
	if out != nil {
		require.NoError(t, json.Unmarshal(r.Result, out))
	}
}

func (e *filesEnv) fails(t *testing.T, method string, params map[string]any, typ, field string) *WireError {
	t.Helper()
	r := e.call(method, params)
	require.NotNil(t, r.Error, "%s %v succeeded", method, params)
	assert.Equal(t, typ, r.Error.Type(), "%+v", r.Error)
	if field != "" {
		assert.Equal(t, field, r.Error.Data["field"], "%+v", r.Error)
	}
	return r.Error
}

func TestFilesRPC(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		for _, transport := range []string{"stdio", "ws"} {
			t.Run(transport, func(t *testing.T) {
				e := newFilesEnv(t, backend, transport)
				sid := "files-" + transport
				e.must(t, "box_create_session", map[string]any{"session_id": sid}, nil)
				at := func(kv ...any) map[string]any {
					m := map[string]any{"session_id": sid}
					for i := 0; i < len(kv); i += 2 {
						m[kv[i].(string)] = kv[i+1]
					}
					return m
				}
				data := []byte("\x00\x01binary\xff\xfe\n")
				var wr struct {
					BytesWritten int64 `json:"bytes_written"`
				}
				e.must(t, "box_fs_write", at("path", "/workspace/d/a.bin", "data_base64", base64.StdEncoding.EncodeToString(data), "mode", 0o640), &wr)
				assert.EqualValues(t, len(data), wr.BytesWritten)

				var rd struct {
					DataBase64 string `json:"data_base64"`
					Size       int64  `json:"size"`
					EOF        bool   `json:"eof"`
				}
				e.must(t, "box_fs_read", at("path", "/workspace/d/a.bin"), &rd)
				got, _ := base64.StdEncoding.DecodeString(rd.DataBase64)
				assert.Equal(t, data, got)
				assert.True(t, rd.EOF)
				e.must(t, "box_fs_read", at("path", "/workspace/d/a.bin", "offset", 2, "length", 6), &rd)
				got, _ = base64.StdEncoding.DecodeString(rd.DataBase64)
				assert.Equal(t, "binary", string(got))
				assert.False(t, rd.EOF)
				assert.EqualValues(t, len(data), rd.Size)

				// A name that is not UTF-8 goes as path_base64 and comes back
				// with name_base64.
				odd := "/workspace/d/caf\xe9"
				e.must(t, "box_fs_write", at("path_base64", base64.StdEncoding.EncodeToString([]byte(odd)), "data_base64", "eA=="), nil)
				var list struct {
					Entries []struct {
						Name       string `json:"name"`
						NameBase64 string `json:"name_base64"`
						Path       string `json:"path"`
						Type       string `json:"type"`
						Size       int64  `json:"size"`
						Mode       uint32 `json:"mode"`
						MTime      string `json:"mtime"`
					} `json:"entries"`
					Truncated bool `json:"truncated"`
				}
				e.must(t, "box_fs_list", at("path", "/workspace", "depth", 2), &list)
				byPath := map[string]int{}
				for i, en := range list.Entries {
					byPath[en.Path] = i
				}
				require.Contains(t, byPath, "/workspace/d/a.bin", "%+v", list.Entries)
				a := list.Entries[byPath["/workspace/d/a.bin"]]
				assert.Equal(t, "file", a.Type)
				assert.EqualValues(t, 0o640, a.Mode)
				assert.EqualValues(t, len(data), a.Size)
				assert.NotEmpty(t, a.MTime)
				assert.Equal(t, "dir", list.Entries[byPath["/workspace/d"]].Type)
				var names []string
				for _, en := range list.Entries {
					names = append(names, en.NameBase64)
				}
				assert.Contains(t, names, base64.StdEncoding.EncodeToString([]byte("caf\xe9")))

				var st map[string]any
				e.must(t, "box_fs_stat", at("path", "/workspace/d"), &st)
				assert.Equal(t, "dir", st["type"])
				e.must(t, "box_fs_mkdir", at("path", "/workspace/x/y"), nil)
				e.must(t, "box_fs_rename", at("from", "/workspace/d/a.bin", "to", "/workspace/x/y/b.bin"), nil)
				e.fails(t, "box_fs_read", at("path", "/workspace/d/a.bin"), "BoxFileNotFoundError", "")
				e.fails(t, "box_fs_remove", at("path", "/workspace/x"), "BoxValidationError", "path")
				e.must(t, "box_fs_remove", at("path", "/workspace/x", "recursive", true), nil)
				werr := e.fails(t, "box_fs_stat", at("path", "/workspace/x"), "BoxFileNotFoundError", "")
				assert.EqualValues(t, -32011, werr.Code)

				// Escapes and refusals.
				out := e.call("box_exec", at("cmd", "ln -s /etc/passwd /workspace/esc && ln -s /proc/1/root /workspace/root"))
				require.Nil(t, out.Error)
				e.fails(t, "box_fs_read", at("path", "/workspace/esc"), "BoxValidationError", "path")
				e.fails(t, "box_fs_read", at("path", "/workspace/root/etc/passwd"), "BoxValidationError", "path")
				e.fails(t, "box_fs_write", at("path", "/etc/x", "data_base64", ""), "BoxValidationError", "path")
				e.fails(t, "box_fs_read", at("path", "relative"), "BoxValidationError", "path")
				e.fails(t, "box_fs_list", at("path", "/workspace", "depth", 99), "BoxValidationError", "depth")
				e.fails(t, "box_fs_read", map[string]any{"session_id": "nope", "path": "/workspace"}, "BoxSessionNotFoundError", "")

				// Size limit: the RPC refuses and names the HTTP endpoint.
				big := base64.StdEncoding.EncodeToString(make([]byte, 9<<20))
				werr = e.fails(t, "box_fs_write", at("path", "/workspace/big", "data_base64", big), "BoxValidationError", "data_base64")
				assert.Contains(t, werr.Message, "/v1/sessions/{session_id}/files")
				assert.Equal(t, "/v1/sessions/{session_id}/files", werr.Data["http_endpoint"])
				e.fails(t, "box_fs_read", at("path", "/workspace/esc2", "length", 9<<20), "BoxValidationError", "length")
			})
		}
	})
}

// pattern is a deterministic stream of n bytes: 1 MiB blocks of a fixed
// random-looking block, each stamped with its index, so a reordered or
// repeated block changes the hash.
type pattern struct {
	n, off int64
	block  []byte
}

func newPattern(n int64) *pattern {
	b := make([]byte, 1<<20)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return &pattern{n: n, block: b}
}

func (p *pattern) Read(buf []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	k := 0
	for k < len(buf) && p.off < p.n {
		blk, in := p.off>>20, p.off&(1<<20-1)
		var stamp [8]byte
		binary.LittleEndian.PutUint64(stamp[:], uint64(blk))
		var c int
		if in < 8 {
			c = copy(buf[k:], stamp[in:])
		} else {
			c = copy(buf[k:], p.block[in:])
		}
		c = int(min(int64(c), p.n-p.off))
		k += c
		p.off += int64(c)
	}
	return k, nil
}

// vmHWM is the peak resident set of pid, in KiB.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}

func filesURL(addr, sessionID, p string, q ...string) string {
	v := url.Values{"path": {p}}
	for i := 0; i+1 < len(q); i += 2 {
		v.Set(q[i], q[i+1])
	}
	return "http://" + addr + "/v1/sessions/" + url.PathEscape(sessionID) + "/files?" + v.Encode()
}

func httpDo(t *testing.T, method, u, token string, body io.Reader) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// TestFilesHTTPLarge moves a large file up and down through the files
// endpoint and checks boxrt's peak RSS does not grow with it: 1 GiB on
// bwrap, a smaller one on docker (docker's exec streams are slower).
func TestFilesHTTPLarge(t *testing.T) {
	sizes := map[string]int64{"bwrap": 1 << 30, "docker": 256 << 20}
	eachBackend(t, func(t *testing.T, backend string) {
		size := sizes[wireBackend(backend)]
		require.NotZero(t, size, "no file size for %s", backend)
		e := newFilesEnv(t, backend, "stdio")
		sid := "large"
		e.must(t, "box_create_session", map[string]any{"session_id": sid, "workspace_quota_mb": 1536}, nil)
		pid := e.p.cmd.Process.Pid
		before := vmHWM(t, pid)

		// The token is required, in the header only.
		resp := httpDo(t, "GET", filesURL(e.p.Addr, sid, "/workspace/x"), "", nil)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

		start := time.Now()
		want := sha256.New()
		resp = httpDo(t, "PUT", filesURL(e.p.Addr, sid, "/workspace/big.bin", "mode", "0600"), e.token, io.TeeReader(newPattern(size), want))
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		up := time.Since(start)
		assert.JSONEq(t, fmt.Sprintf(`{"path":"/workspace/big.bin","bytes_written":%d}`, size), string(body))
		afterUp := vmHWM(t, pid)

		start = time.Now()
		resp = httpDo(t, "GET", filesURL(e.p.Addr, sid, "/workspace/big.bin"), e.token, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, strconv.FormatInt(size, 10), resp.Header.Get("Content-Length"))
		assert.Equal(t, "0600", resp.Header.Get("X-Boxrt-File-Mode"))
		got := sha256.New()
		n, err := io.Copy(got, resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		down := time.Since(start)
		afterDown := vmHWM(t, pid)
		assert.Equal(t, size, n)
		assert.Equal(t, want.Sum(nil), got.Sum(nil), "downloaded bytes differ from the uploaded ones")

		mb := float64(size) / (1 << 20)
		t.Logf("%s: %.0f MiB up in %v (%.0f MiB/s), down in %v (%.0f MiB/s); boxrt VmHWM %d KiB before, %d after upload, %d after download",
			backend, mb, up.Round(time.Millisecond), mb/up.Seconds(), down.Round(time.Millisecond), mb/down.Seconds(), before, afterUp, afterDown)
		// Flat: the peak may grow by buffers and the race detector's
		// bookkeeping, never by anything near the file's size.
		assert.Less(t, afterDown-before, int64(64<<10), "boxrt's peak RSS grew by %d KiB moving %d MiB", afterDown-before, size>>20)

		// A range, a missing file and a path outside the mounts.
		resp = httpDo(t, "GET", filesURL(e.p.Addr, sid, "/workspace/big.bin", "offset", "8", "length", "4"), e.token, nil)
		part, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		pat := newPattern(12)
		exp, _ := io.ReadAll(pat)
		assert.Equal(t, exp[8:12], part)
		for _, c := range []struct {
			method, path string
			status       int
			typ          string
		}{
			{"GET", "/workspace/missing", 404, "BoxFileNotFoundError"},
			{"GET", "/etc/passwd", 400, "BoxValidationError"},
			{"PUT", "/usr/x", 400, "BoxValidationError"},
		} {
			resp = httpDo(t, c.method, filesURL(e.p.Addr, sid, c.path), e.token, strings.NewReader("x"))
			var body struct {
				Error struct{ Type, Message string } `json:"error"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			assert.Equal(t, c.status, resp.StatusCode, "%s %s: %+v", c.method, c.path, body)
			assert.Equal(t, c.typ, body.Error.Type)
		}
		e.must(t, "box_delete_session", map[string]any{"session_id": sid}, nil)
	})
}

// TestFilesClient drives the reconnect client's file helpers against a
// dialed runtime and a spawned one (whose files endpoint and token come
// from box_health).
func TestFilesClient(t *testing.T) {
	cfg := "{" + backendConfigs["bwrap"] + "}"
	p := Start(t, Options{Config: cfg})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dialed, err := reconnect.Dial(ctx, "http://"+p.Addr, reconnect.WithToken(p.Token))
	require.NoError(t, err)
	defer dialed.Close()
	spawned, err := reconnect.Spawn(ctx, reconnect.WithCommand(binPath, "serve", "--stdio", "--listen", "127.0.0.1:0",
		"--state-dir", t.TempDir()), reconnect.WithEnv(append(os.Environ(), "BOXRT_CONFIG="+cfg)), reconnect.WithStderr(io.Discard))
	require.NoError(t, err)
	defer spawned.Close()
	for name, c := range map[string]*reconnect.Client{"dial": dialed, "spawn": spawned} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, c.Call(ctx, "box_create_session", map[string]any{"session_id": "client"}, nil))
			require.NoError(t, c.WriteFile(ctx, "client", "/workspace/s\xe9/small.txt", []byte("small"), 0o600))
			got, err := c.ReadFile(ctx, "client", "/workspace/s\xe9/small.txt")
			require.NoError(t, err)
			assert.Equal(t, "small", string(got))

			n, err := c.Upload(ctx, "client", "/workspace/big.bin", newPattern(20<<20), 0)
			require.NoError(t, err)
			assert.EqualValues(t, 20<<20, n)
			want, _ := io.ReadAll(newPattern(20 << 20))
			var buf bytes.Buffer
			_, err = c.Download(ctx, "client", "/workspace/big.bin", &buf)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, buf.Bytes()), "download differs")
			whole, err := c.ReadFile(ctx, "client", "/workspace/big.bin")
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, whole), "chunked box_fs_read differs")

			entries, err := c.ListFiles(ctx, "client", "/workspace", 2)
			require.NoError(t, err)
			var paths []string
			for _, e := range entries {
				paths = append(paths, e.RawPath())
			}
			assert.Contains(t, paths, "/workspace/s\xe9/small.txt")
			require.NoError(t, c.RenameFile(ctx, "client", "/workspace/big.bin", "/workspace/moved.bin"))
			require.NoError(t, c.MakeDir(ctx, "client", "/workspace/d/e"))
			fi, err := c.StatFile(ctx, "client", "/workspace/d/e")
			require.NoError(t, err)
			assert.Equal(t, "dir", fi.Type)
			require.NoError(t, c.RemoveFile(ctx, "client", "/workspace/d", true))
			_, err = c.StatFile(ctx, "client", "/workspace/d")
			assert.ErrorIs(t, err, reconnect.ErrFileNotFound)
			_, err = c.Download(ctx, "client", "/workspace/big.bin", io.Discard)
			assert.ErrorIs(t, err, reconnect.ErrFileNotFound)
			_, err = c.Upload(ctx, "client", "/etc/x", strings.NewReader("x"), 0)
			assert.ErrorIs(t, err, reconnect.ErrValidation)
		})
	}
}

// runCp runs boxrt cp against p with its generated token.
func runCp(t *testing.T, p *Proc, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	return runBinWithStdin(t, stdin, nil, append([]string{"cp", "--url", "http://" + p.Addr, "--state-dir", p.State}, args...)...)
}

func TestCp(t *testing.T) {
	p := Start(t, Options{Config: "{" + backendConfigs["bwrap"] + "}"})
	ws := DialWS(t, p.Addr, p.Token)
	require.Nil(t, ws.Call("box_create_session", map[string]any{"session_id": "cp"}).Error)
	dir := t.TempDir()
	local := filepath.Join(dir, "in.bin")
	want, _ := io.ReadAll(newPattern(5 << 20))
	require.NoError(t, os.WriteFile(local, want, 0o644))

	_, stderr, code := runCp(t, p, nil, "--progress", "--mode", "600", local, "cp:/workspace/up/")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "5.0 MiB / 5.0 MiB (100%)")
	r := ws.Call("box_fs_stat", map[string]any{"session_id": "cp", "path": "/workspace/up/in.bin"})
	require.Nil(t, r.Error)
	assert.Contains(t, string(r.Result), `"mode":384`)

	out := filepath.Join(dir, "out")
	require.NoError(t, os.Mkdir(out, 0o755))
	_, stderr, code = runCp(t, p, nil, "cp:/workspace/up/in.bin", out)
	require.Equal(t, 0, code, stderr)
	got, err := os.ReadFile(filepath.Join(out, "in.bin"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(want, got), "download differs")

	_, stderr, code = runCp(t, p, strings.NewReader("from stdin"), "-", "cp:/workspace/s.txt")
	require.Equal(t, 0, code, stderr)
	stdout, stderr, code := runCp(t, p, nil, "cp:/workspace/s.txt", "-")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "from stdin", stdout)

	_, stderr, code = runCp(t, p, nil, "cp:/workspace/missing", filepath.Join(dir, "x"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "BoxFileNotFoundError")
	entries, _ := os.ReadDir(dir)
	assert.Len(t, entries, 2, "a failed download leaves no temporary file: %v", entries)
	_, stderr, code = runCp(t, p, nil, local, filepath.Join(dir, "y"))
	assert.Equal(t, 2, code, stderr)
}

// watchEvent is a box_fs_event notification.
type watchEvent struct {
	Method string `json:"method"`
	Params struct {
		WatchID   string `json:"watch_id"`
		SessionID string `json:"session_id"`
		Events    []struct {
			Event string `json:"event"`
			Type  string `json:"type"`
			Path  string `json:"path"`
		} `json:"events"`
		Ended *struct{ Type, Message string } `json:"ended"`
	} `json:"params"`
}

// nextEvent reads notifications until one of watch id arrives.
func nextEvent(t *testing.T, p *Proc, id string) watchEvent {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		var ev watchEvent
		require.NoError(t, json.Unmarshal(p.NextLine(time.Until(deadline)), &ev))
		if ev.Method == "box_fs_event" && ev.Params.WatchID == id {
			return ev
		}
	}
	t.Fatalf("no box_fs_event for %s", id)
	return watchEvent{}
}

// eventsOf renders a notification's events, leaving out directories
// whose mtime changed: whether a poll sees a directory made and filled at
// once or in two steps (made, then modified) is timing.
func eventsOf(ev watchEvent) []string {
	var out []string
	for _, e := range ev.Params.Events {
		if e.Event != "modified" || e.Type != "dir" {
			out = append(out, e.Event+" "+e.Type+" "+e.Path)
		}
	}
	return out
}

func TestFilesWatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		e := newFilesEnv(t, backend, "stdio")
		p := e.p
		e.must(t, "box_create_session", map[string]any{"session_id": "w"}, nil)
		e.must(t, "box_fs_mkdir", map[string]any{"session_id": "w", "path": "/workspace/w"}, nil)
		var res struct {
			WatchID string `json:"watch_id"`
		}
		e.must(t, "box_fs_watch", map[string]any{"session_id": "w", "path": "/workspace/w", "depth": 2, "interval_ms": 300}, &res)
		require.NotEmpty(t, res.WatchID)
		exec := func(cmd string) {
			e.must(t, "box_exec", map[string]any{"session_id": "w", "cmd": cmd}, nil)
		}
		exec("echo x > /workspace/w/a && mkdir /workspace/w/d && echo y > /workspace/w/d/b")
		var got []string
		for len(got) < 3 {
			got = append(got, eventsOf(nextEvent(t, p, res.WatchID))...)
		}
		assert.ElementsMatch(t, []string{"created file /workspace/w/a", "created dir /workspace/w/d", "created file /workspace/w/d/b"}, got)
		exec("rm /workspace/w/a && echo longer >> /workspace/w/d/b")
		got = nil
		for len(got) < 2 {
			got = append(got, eventsOf(nextEvent(t, p, res.WatchID))...)
		}
		assert.ElementsMatch(t, []string{"removed file /workspace/w/a", "modified file /workspace/w/d/b"}, got)

		e.must(t, "box_fs_unwatch", map[string]any{"watch_id": res.WatchID}, nil)
		e.fails(t, "box_fs_unwatch", map[string]any{"watch_id": res.WatchID}, "BoxValidationError", "watch_id")
		e.fails(t, "box_fs_watch", map[string]any{"session_id": "w", "path": "/workspace/nope"}, "BoxFileNotFoundError", "")
		e.fails(t, "box_fs_watch", map[string]any{"session_id": "w", "path": "/etc"}, "BoxValidationError", "path")

		// The watch ends, saying why, when its session goes.
		e.must(t, "box_fs_watch", map[string]any{"session_id": "w", "path": "/workspace", "interval_ms": 300}, &res)
		e.must(t, "box_delete_session", map[string]any{"session_id": "w"}, nil)
		ev := nextEvent(t, p, res.WatchID)
		require.NotNil(t, ev.Params.Ended, "%+v", ev)
		assert.Equal(t, "BoxSessionNotFoundError", ev.Params.Ended.Type)
		e.fails(t, "box_fs_unwatch", map[string]any{"watch_id": res.WatchID}, "BoxValidationError", "watch_id")
	})
}

// A watch belongs to its connection: over WebSocket its events arrive as
// notification frames, and closing the socket ends it.
func TestFilesWatchEndsWithItsConnection(t *testing.T) {
	p := Start(t, Options{Config: "{" + backendConfigs["bwrap"] + "}"})
	ws := DialWS(t, p.Addr, p.Token)
	require.Nil(t, ws.Call("box_create_session", map[string]any{"session_id": "wws"}).Error)
	r := ws.Call("box_fs_watch", map[string]any{"session_id": "wws", "path": "/workspace", "interval_ms": 200})
	require.Nil(t, r.Error)
	var res struct {
		WatchID string `json:"watch_id"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &res))
	other := DialWS(t, p.Addr, p.Token)
	require.Nil(t, other.Call("box_fs_write", map[string]any{"session_id": "wws", "path": "/workspace/n.txt", "data_base64": "eA=="}).Error)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, data, err := ws.C.Read(ctx)
		require.NoError(t, err)
		var ev watchEvent
		require.NoError(t, json.Unmarshal(data, &ev))
		if ev.Method == "box_fs_event" {
			assert.Equal(t, []string{"created file /workspace/n.txt"}, eventsOf(ev))
			break
		}
	}
	ws.C.CloseNow()
	// The server sees the socket close at once; give it a moment, then
	// one unwatch (which would stop a live watch, so it is asked once).
	time.Sleep(time.Second)
	r = other.Call("box_fs_unwatch", map[string]any{"watch_id": res.WatchID})
	require.NotNil(t, r.Error, "the watch outlived its connection")
	assert.Equal(t, "BoxValidationError", r.Error.Type())
}

// cpuSeconds is the CPU time process pid has used (user and system).
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	// Fields after the command name (which may hold spaces): state is the
	// first, utime and stime the 12th and 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	require.NoError(t, errors.Join(err1, err2))
	return (utime + stime) / 100 // USER_HZ
}

// TestFilesWatchCostBound: watches are bounded by what they cost together
// (entries listed per second), not only by their number: four watches of
// a 5,000-entry directory at 200 ms fit in max_watch_scan_rate
// (100,000/s), the fifth is a BoxCapacityExceededError naming the limit,
// and unwatching one makes room again. On bwrap the workspace is a host
// directory: the watches wait on inotify, so while nothing changes they
// cost (almost) no CPU, and a change still arrives.
func TestFilesWatchCostBound(t *testing.T) {
	e := newFilesEnv(t, "bwrap", "stdio")
	e.must(t, "box_create_session", map[string]any{"session_id": "cost"}, nil)
	e.must(t, "box_exec", map[string]any{"session_id": "cost",
		"cmd": "mkdir /workspace/big && cd /workspace/big && seq 5000 | xargs touch && ls | wc -l"}, nil)
	watch := map[string]any{"session_id": "cost", "path": "/workspace/big", "interval_ms": 200}
	var ids []string
	for range 4 {
		var res struct {
			WatchID string `json:"watch_id"`
		}
		e.must(t, "box_fs_watch", watch, &res)
		ids = append(ids, res.WatchID)
	}
	time.Sleep(time.Second)
	pid := e.p.cmd.Process.Pid
	before := cpuSeconds(t, pid)
	time.Sleep(4 * time.Second)
	used := cpuSeconds(t, pid) - before
	t.Logf("boxrt used %.2f s of CPU in 4 s with 4 idle watches of 5,000 entries at 200 ms", used)
	assert.Less(t, used, 0.4, "idle watches of a host directory keep listing")
	e.must(t, "box_exec", map[string]any{"session_id": "cost", "cmd": "rm /workspace/big/1 && echo x > /workspace/big/new"}, nil)
	var got []string
	for len(got) < 2 {
		got = append(got, eventsOf(nextEvent(t, e.p, ids[0]))...)
	}
	assert.ElementsMatch(t, []string{"removed file /workspace/big/1", "created file /workspace/big/new"}, got)

	werr := e.fails(t, "box_fs_watch", watch, "BoxCapacityExceededError", "")
	assert.Equal(t, "max_watch_scan_rate", werr.Data["limit"], "%+v", werr)
	e.must(t, "box_fs_unwatch", map[string]any{"watch_id": ids[0]}, nil)
	e.must(t, "box_fs_watch", watch, nil)
}
