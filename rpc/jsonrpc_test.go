package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestJSONRPCDecode(t *testing.T) {
	tests := []struct {
		name   string
		frame  string
		method string // "" with code 0: ignored
		id     string // the id as it is echoed back
		notif  bool
		meta   *Meta
		code   int64 // 0: accepted
	}{
		{name: "request", frame: `{"jsonrpc":"2.0","id":1,"method":"m","params":{}}`, method: "m", id: "1"},
		{name: "string id", frame: `{"jsonrpc":"2.0","id":"a","method":"m"}`, method: "m", id: `"a"`},
		{name: "null id is a request", frame: `{"jsonrpc":"2.0","id":null,"method":"m"}`, method: "m", id: "null"},
		{name: "fractional id kept as sent", frame: `{"jsonrpc":"2.0","id":-1.5e3,"method":"m"}`, method: "m", id: "-1.5e3"},
		{name: "notification", frame: `{"jsonrpc":"2.0","method":"m"}`, method: "m", id: "null", notif: true},
		{name: "meta decoded", frame: `{"jsonrpc":"2.0","id":1,"method":"m","meta":{"instance_uuid":"i","workspace_uuid":"w","placement_generation":2}}`,
			method: "m", id: "1", meta: &Meta{InstanceUUID: "i", WorkspaceUUID: "w", PlacementGeneration: 2}},
		{name: "malformed meta ignored", frame: `{"jsonrpc":"2.0","id":1,"method":"m","meta":{"placement_generation":"x"}}`, method: "m", id: "1"},
		{name: "meta not an object ignored", frame: `{"jsonrpc":"2.0","id":1,"method":"m","meta":7}`, method: "m", id: "1"},
		{name: "response ignored", frame: `{"jsonrpc":"2.0","id":1,"result":{}}`},
		{name: "blank ignored", frame: "  \t"},
		{name: "garbage", frame: "garbage", code: boxerr.ErrParse.Code, id: "null"},
		{name: "invalid utf8", frame: "{\"a\":\"\xff\"}", code: boxerr.ErrParse.Code, id: "null"},
		{name: "truncated", frame: `{"jsonrpc":"2.0","id":1,"method"`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "batch", frame: `[{"jsonrpc":"2.0","id":1,"method":"m"}]`, code: boxerr.ErrInvalidRequest.Code, id: "null"},
		{name: "scalar", frame: `42`, code: boxerr.ErrInvalidRequest.Code, id: "null"},
		{name: "wrong version", frame: `{"jsonrpc":"1.0","id":1,"method":"m"}`, code: boxerr.ErrInvalidRequest.Code, id: "1"},
		{name: "object id", frame: `{"jsonrpc":"2.0","id":{},"method":"m"}`, code: boxerr.ErrInvalidRequest.Code, id: "null"},
		{name: "empty method", frame: `{"jsonrpc":"2.0","id":2,"method":""}`, code: boxerr.ErrInvalidRequest.Code, id: "2"},
		{name: "scalar params", frame: `{"jsonrpc":"2.0","id":3,"method":"m","params":5}`, code: boxerr.ErrInvalidRequest.Code, id: "3"},
		{name: "method wrong type keeps the id", frame: `{"jsonrpc":"2.0","id":4,"method":4}`, code: boxerr.ErrInvalidRequest.Code, id: "4"},
		// What the one-pass scan must refuse to accept (the general path
		// then words the refusal) and what it must accept as valid JSON.
		{name: "spaces everywhere", frame: " { \"jsonrpc\" :\t\"2.0\" ,\r\n \"id\" : \"a\\\"b\\u0041\" , \"method\" : \"m\" } ",
			method: "m", id: `"a\"b\u0041"`},
		{name: "exponent id", frame: `{"jsonrpc":"2.0","id":-0.5E+3,"method":"m","params":[1,{"x":"}"}]}`, method: "m", id: "-0.5E+3"},
		{name: "leading zero", frame: `{"jsonrpc":"2.0","id":01,"method":"m"}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "bare point", frame: `{"jsonrpc":"2.0","id":1.,"method":"m"}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "bare minus", frame: `{"jsonrpc":"2.0","id":-,"method":"m"}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "empty exponent", frame: `{"jsonrpc":"2.0","id":1e,"method":"m"}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "short literal", frame: `{"jsonrpc":"2.0","id":nul,"method":"m"}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "bad escape", frame: `{"jsonrpc":"2.0","id":"\x","method":"m"}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "short unicode escape", frame: `{"jsonrpc":"2.0","id":"\u00g1","method":"m"}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "control character in a string", frame: "{\"jsonrpc\":\"2.0\",\"id\":\"a\tb\",\"method\":\"m\"}", code: boxerr.ErrParse.Code, id: "null"},
		{name: "trailing comma", frame: `{"jsonrpc":"2.0","id":1,"method":"m",}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "missing comma", frame: `{"jsonrpc":"2.0" "id":1,"method":"m"}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "text after the object", frame: `{"jsonrpc":"2.0","id":1,"method":"m"} x`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "mismatched brackets in params", frame: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":[1}]}`, code: boxerr.ErrParse.Code, id: "null"},
		{name: "unterminated string", frame: `{"jsonrpc":"2.0","id":1,"method":"m`, code: boxerr.ErrParse.Code, id: "null"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := decode(JSONRPC{}, []byte(tc.frame))
			if tc.code != 0 {
				var de *DecodeError
				require.ErrorAs(t, err, &de)
				assert.Equal(t, tc.code, de.Err.Code)
				assert.Equal(t, tc.id, string(orNull(de.ID)))
				return
			}
			require.NoError(t, err)
			if tc.method == "" {
				assert.Nil(t, req)
				return
			}
			require.NotNil(t, req)
			assert.Equal(t, tc.method, req.Method)
			assert.Equal(t, tc.id, string(orNull(req.ID)))
			assert.Equal(t, tc.notif, req.Notif)
			assert.Equal(t, tc.meta, req.Meta)
		})
	}
}

func orNull(id json.RawMessage) json.RawMessage {
	if id == nil {
		return nullID
	}
	return id
}

func TestJSONRPCEncode(t *testing.T) {
	tests := []struct {
		name string
		msg  Message
		want string
	}{
		{name: "result", msg: Message{ID: json.RawMessage(`"x"`), Result: json.RawMessage(`{"a":1}`)},
			want: `{"jsonrpc":"2.0","id":"x","result":{"a":1}}`},
		{name: "nil result is {}", msg: Message{ID: json.RawMessage(`7`)}, want: `{"jsonrpc":"2.0","id":7,"result":{}}`},
		{name: "error without id", msg: Message{Error: &Error{Code: -32700, Type: "ParseError", Message: "bad"}},
			want: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"ParseError: bad","data":{"retryable":false,"type":"ParseError"}}}`},
		{name: "notification", msg: Message{Method: "box_exec_output", Params: json.RawMessage(`{"chunk":"hi"}`)},
			want: `{"jsonrpc":"2.0","method":"box_exec_output","params":{"chunk":"hi"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			frames, err := JSONRPC{}.Encode(nil, tc.msg)
			require.NoError(t, err)
			require.Len(t, frames, 1)
			assert.Equal(t, tc.want, string(frames[0]))
		})
	}
}

func TestLineConnOversize(t *testing.T) {
	big := strings.Repeat("x", 200)
	in := "small\n" + big + "\n\n  \nafter\n" + strings.Repeat("y", 90) + "\nlast-without-newline"
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
	assert.Equal(t, []string{"small", "<too large>", "after", strings.Repeat("y", 90), "last-without-newline"}, got)
}

// TestLineConnWritesLongFramesInOrder: a long frame is written from its
// own buffer with its newline, after the short ones buffered before it,
// and one without spare capacity is still written whole.
func TestLineConnWritesLongFramesInOrder(t *testing.T) {
	var out bytes.Buffer
	writes := 0
	c := newLineConn(strings.NewReader(""), writerFunc(func(p []byte) (int, error) {
		writes++
		return out.Write(p)
	}), MaxMessageBytes, nil)
	long := strings.Repeat("L", directFrameBytes)
	frames, err := JSONRPC{}.Encode(nil, Message{Method: "m", Params: json.RawMessage(`"` + long + `"`)})
	require.NoError(t, err)
	exact := []byte(long) // no spare capacity: through the buffer
	require.NoError(t, c.WriteFrame([]byte("short")))
	require.NoError(t, c.WriteFrame(frames[0]))
	require.NoError(t, c.WriteFrame(exact))
	require.NoError(t, c.WriteFrame([]byte("tail")))
	require.NoError(t, c.Flush())
	assert.Equal(t, "short\n"+string(frames[0])+"\n"+long+"\ntail\n", out.String())
	assert.Equal(t, 3, writes, "the short frame, the long one, then the rest buffered")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// FuzzDecode feeds arbitrary frames through the codec: nothing may panic,
// every refused frame is answered with valid JSON carrying a valid id, and
// an accepted request's answer is valid JSON echoing its id.
func FuzzDecode(f *testing.F) {
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
		req, err := decode(JSONRPC{}, frame)
		var m Message
		switch {
		case err != nil:
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("refusal %v is not a *DecodeError", err)
			}
			if !strings.HasPrefix(de.Err.jsonrpc().Message, de.Err.Type+": ") {
				t.Fatalf("message %q lacks the type prefix", de.Err.jsonrpc().Message)
			}
			m = Message{ID: de.ID, Error: de.Err}
		case req == nil:
			return
		default:
			m = Message{ID: req.ID, Result: json.RawMessage(`{}`)}
		}
		frames, err := JSONRPC{}.Encode(nil, m)
		if err != nil {
			t.Fatal(err)
		}
		var back struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(frames[0], &back); err != nil {
			t.Fatalf("answer %q is not JSON: %v", frames[0], err)
		}
		if !bytes.Equal(back.ID, orNull(m.ID)) {
			t.Fatalf("answer id %q, request id %q", back.ID, m.ID)
		}
	})
}

// FuzzDecodeFast holds the one-pass decoder to encoding/json's answer:
// whatever it accepts, the general path accepts as the same request.
func FuzzDecodeFast(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"__ping","params":{}}`,
		` { "jsonrpc" : "2.0" , "id" : "a\"b" , "method" : "m" , "params" : [1,{"x":"}"}] } `,
		`{"jsonrpc":"2.0","method":"m","meta":{"instance_uuid":"i","placement_generation":1},"extra":[{}]}`,
		`{"jsonrpc":"2.0","id":null,"method":"m","params":null}`,
		`{"jsonrpc":"2.0","ID":1,"method":"m"}`, `{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}`,
		`{"jsonrpc":"2.0","id":-0.5e-3,"method":"m\u0041"}`, `{"jsonrpc":"2.0","id":1,"method":"m","result":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		trimmed := bytes.TrimSpace(frame)
		if len(trimmed) == 0 || trimmed[0] != '{' || !utf8.Valid(trimmed) {
			return // Decode refuses these before either path
		}
		var fast, general Request
		if !decodeFast(trimmed, &fast) {
			return
		}
		if ok, err := decodeGeneral(trimmed, &general); !ok || err != nil {
			t.Fatalf("fast path accepted %q, general path refused it: %v", frame, err)
		}
		if fast.Method != general.Method || !bytes.Equal(fast.ID, general.ID) || fast.Notif != general.Notif ||
			!bytes.Equal(fast.Params, general.Params) || !reflect.DeepEqual(fast.Meta, general.Meta) {
			t.Fatalf("%q: fast %+v, general %+v", frame, &fast, &general)
		}
	})
}

// decode is Codec.Decode returning the request, nil when there is nothing
// to do.
func decode(c Codec, frame []byte) (*Request, error) {
	var req Request
	ok, err := c.Decode(frame, &req)
	if !ok {
		return nil, err
	}
	return &req, err
}
