package rpc

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/runtime/boxerr"
)

func TestDecodeFrame(t *testing.T) {
	tests := []struct {
		name  string
		frame string
		kind  frameKind
		id    string
		code  int64 // 0: valid
	}{
		{name: "request", frame: `{"jsonrpc":"2.0","id":1,"method":"m","params":{}}`, kind: frameRequest, id: "1"},
		{name: "string id", frame: `{"jsonrpc":"2.0","id":"a","method":"m"}`, kind: frameRequest, id: `"a"`},
		{name: "null id is a request", frame: `{"jsonrpc":"2.0","id":null,"method":"m"}`, kind: frameRequest, id: "null"},
		{name: "notification", frame: `{"jsonrpc":"2.0","method":"m"}`, kind: frameNotification, id: "null"},
		{name: "response ignored", frame: `{"jsonrpc":"2.0","id":1,"result":{}}`, kind: frameResponse, id: "1"},
		{name: "garbage", frame: "garbage", code: boxerr.ErrParse.Code, id: "null"},
		{name: "invalid utf8", frame: "{\"a\":\"\xff\"}", code: boxerr.ErrParse.Code, id: "null"},
		{name: "batch", frame: `[{"jsonrpc":"2.0","id":1,"method":"m"}]`, code: boxerr.ErrInvalidRequest.Code, id: "null"},
		{name: "wrong version", frame: `{"jsonrpc":"1.0","id":1,"method":"m"}`, code: boxerr.ErrInvalidRequest.Code, id: "1"},
		{name: "object id", frame: `{"jsonrpc":"2.0","id":{},"method":"m"}`, code: boxerr.ErrInvalidRequest.Code, id: "null"},
		{name: "empty method", frame: `{"jsonrpc":"2.0","id":2,"method":""}`, code: boxerr.ErrInvalidRequest.Code, id: "2"},
		{name: "scalar params", frame: `{"jsonrpc":"2.0","id":3,"method":"m","params":5}`, code: boxerr.ErrInvalidRequest.Code, id: "3"},
		{name: "method wrong type keeps the id", frame: `{"jsonrpc":"2.0","id":4,"method":4}`, code: boxerr.ErrInvalidRequest.Code, id: "4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, id, err := decodeFrame([]byte(tc.frame))
			if tc.code != 0 {
				require.NotNil(t, err)
				assert.Equal(t, tc.code, err.Code)
				assert.Equal(t, tc.id, string(id))
				return
			}
			require.Nil(t, err)
			require.NotNil(t, d)
			assert.Equal(t, tc.kind, d.kind)
			assert.Equal(t, tc.id, string(d.id))
		})
	}
}

func TestLineConnOversize(t *testing.T) {
	big := strings.Repeat("x", 200)
	in := "small\n" + big + "\n\n  \nafter\nlast-without-newline"
	c := newLineConn(strings.NewReader(in), io.Discard, 100, nil)
	got := []string{}
	for {
		f, err := c.ReadFrame()
		if err == errFrameTooLarge {
			got = append(got, "<too large>")
			continue
		}
		if err != nil {
			break
		}
		got = append(got, string(f))
	}
	assert.Equal(t, []string{"small", "<too large>", "after", "last-without-newline"}, got)
}

// FuzzDecodeFrame feeds arbitrary frames through validation and the stream:
// nothing may panic, every refused frame gets exactly one error response
// with a valid id, and accepted requests re-encode to what jsonrpc2 reads.
func FuzzDecodeFrame(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"__ping","params":{}}`,
		`{"jsonrpc":"2.0","id":"x","method":"box_exec","params":{"session_id":"s","cmd":"echo"}}`,
		`{"jsonrpc":"2.0","id":null,"method":"m"}`,
		`{"jsonrpc":"2.0","id":-1.5e3,"method":"m","params":[1]}`,
		`{"jsonrpc":"2.0","method":"notify"}`,
		`{"jsonrpc":"1.0","id":1,"method":"m"}`,
		`[]`, `[1,2]`, `{}`, `null`, `"str"`, `42`, "\xff\xfe", `{"jsonrpc":"2.0","id":1,"method"`,
		`{"jsonrpc":"2.0","id":{"a":1},"method":"m"}`, `{"jsonrpc":"2.0","id":1,"result":1}`,
		`{"jsonrpc":"2.0","id":1,"method":"m","meta":{"instance_uuid":"i"}}`,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		d, id, perr := decodeFrame(frame)
		if perr != nil {
			if !json.Valid(id) {
				t.Fatalf("error id %q is not JSON", id)
			}
			if !strings.HasPrefix(perr.jsonrpc().Message, perr.Type+": ") {
				t.Fatalf("message %q lacks the type prefix", perr.jsonrpc().Message)
			}
			return
		}
		if d == nil || d.kind == frameResponse {
			return
		}
		if !json.Valid(d.id) {
			t.Fatalf("accepted id %q is not JSON", d.id)
		}
		var out bytes.Buffer
		s := newServerStream(newLineConn(bytes.NewReader(append(bytes.TrimSpace(frame), '\n')), &out, MaxMessageBytes, nil), nopLogger(), nil)
		var v struct {
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		if err := s.ReadObject(&v); err != nil {
			t.Fatalf("stream refused a frame decodeFrame accepted: %v", err)
		}
		if v.Method != d.method {
			t.Fatalf("method %q became %q", d.method, v.Method)
		}
	})
}
