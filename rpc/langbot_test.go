package rpc

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestLangBotDecode(t *testing.T) {
	tests := []struct {
		name    string
		frame   string
		action  string // "" and no refusal: skipped
		id      string
		meta    *Meta
		refused string // the ValidationError text's start
	}{
		{name: "request", frame: `{"seq_id": 7, "action": "box_exec", "data": {"cmd": "x"}}`, action: "box_exec", id: "7"},
		{name: "context", frame: `{"seq_id":1,"action":"a","data":{},"context":{"instance_uuid":" i ","workspace_uuid":"w","placement_generation":3}}`,
			action: "a", id: "1", meta: &Meta{InstanceUUID: "i", WorkspaceUUID: "w", PlacementGeneration: 3}},
		{name: "generation defaults to 1", frame: `{"seq_id":1,"action":"a","data":{},"context":{"instance_uuid":"i","workspace_uuid":"w"}}`,
			action: "a", id: "1", meta: &Meta{InstanceUUID: "i", WorkspaceUUID: "w", PlacementGeneration: 1}},
		{name: "installation binding", frame: `{"seq_id":1,"action":"a","data":{},"context":{"instance_uuid":"i","workspace_uuid":"w","installation_uuid":"x","runtime_revision":2,"artifact_digest":"ab"}}`,
			action: "a", id: "1", meta: &Meta{InstanceUUID: "i", WorkspaceUUID: "w", PlacementGeneration: 1}},
		{name: "null context is none", frame: `{"seq_id":1,"action":"a","data":{},"context":null}`, action: "a", id: "1"},
		{name: "a type that is not a chunk is a message", frame: `{"type":"x","seq_id":2,"action":"a","data":{}}`, action: "a", id: "2"},
		{name: "response ignored", frame: `{"seq_id":1,"code":0,"message":"success","data":{},"action":"a"}`},
		{name: "no action ignored", frame: `{"seq_id":1,"data":{}}`},
		{name: "not an object skipped", frame: `[1,2]`},
		{name: "stray print skipped", frame: `hello world`},
		{name: "not json skipped", frame: `{"seq_id":1,`},
		{name: "chunk_data outside a chunked message ignored", frame: `{"type":"chunk_data","data":"x","offset":0}`},
		{name: "missing data", frame: `{"seq_id":3,"action":"a"}`, id: "3", refused: "data:"},
		{name: "list data", frame: `{"seq_id":3,"action":"a","data":[]}`, id: "3", refused: "data:"},
		{name: "string seq_id echoed raw", frame: `{"seq_id":"x","action":"a","data":{}}`, id: `"x"`, refused: "seq_id:"},
		{name: "missing seq_id answers -1", frame: `{"action":"a","data":{}}`, id: "-1", refused: "seq_id:"},
		{name: "action not a string", frame: `{"seq_id":4,"action":5,"data":{}}`, id: "4", refused: "action:"},
		{name: "extra context key", frame: `{"seq_id":5,"action":"a","data":{},"context":{"instance_uuid":"i","workspace_uuid":"w","x":1}}`, id: "5", refused: "context: x: Extra inputs"},
		{name: "generation 0", frame: `{"seq_id":5,"action":"a","data":{},"context":{"instance_uuid":"i","workspace_uuid":"w","placement_generation":0}}`, id: "5", refused: "context: placement_generation"},
		{name: "blank workspace", frame: `{"seq_id":5,"action":"a","data":{},"context":{"instance_uuid":"i","workspace_uuid":" "}}`, id: "5", refused: "context: workspace_uuid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := decode(NewLangBot(true), []byte(tc.frame))
			if tc.refused != "" {
				var de *DecodeError
				require.ErrorAs(t, err, &de)
				assert.Equal(t, tc.id, string(de.ID))
				assert.Equal(t, "ValidationError", de.Err.Type)
				assert.True(t, strings.HasPrefix(de.Err.Message, tc.refused), de.Err.Message)
				return
			}
			require.NoError(t, err)
			if tc.action == "" {
				assert.Nil(t, req)
				return
			}
			require.NotNil(t, req)
			assert.Equal(t, tc.action, req.Method)
			assert.Equal(t, tc.id, string(req.ID))
			assert.Equal(t, tc.meta, req.Meta)
		})
	}
}

func TestLangBotEncodeAnswers(t *testing.T) {
	long := strings.Repeat("é", 5000)
	tests := []struct {
		name string
		m    Message
		want string
	}{
		{name: "success", m: Message{ID: json.RawMessage("48213"), Result: json.RawMessage(`{"a":1}`)},
			want: `{"seq_id":48213,"code":0,"message":"success","data":{"a":1},"chunk_status":"continue"}`},
		{name: "empty result", m: Message{ID: json.RawMessage("1")},
			want: `{"seq_id":1,"code":0,"message":"success","data":{},"chunk_status":"continue"}`},
		{name: "box error keeps its class", m: Message{ID: json.RawMessage("2"), Error: &Error{Type: "BoxSessionNotFoundError", Message: "session s not found"}},
			want: `{"seq_id":2,"code":1,"message":"BoxSessionNotFoundError: session s not found","data":{},"chunk_status":"continue"}`},
		{name: "unknown action", m: Message{ID: json.RawMessage("3"), Error: &Error{Type: boxerr.ErrMethodNotFound.Type, Message: `method "x" not found`, Details: map[string]any{"method": "__heartbeat"}}},
			want: `{"seq_id":3,"code":1,"message":"ValueError: Action __heartbeat not found","data":{},"chunk_status":"continue"}`},
		{name: "queue full says when to retry", m: Message{ID: json.RawMessage("4"), Error: queueFull(4096, 1500*time.Millisecond)},
			want: `{"seq_id":4,"code":1,"message":"BoxCapacityExceededError: Runtime connection queue is full (at most 4096 requests wait on one connection); retry after 1500 ms","data":{"retry_after_ms":1500},"chunk_status":"continue"}`},
		{name: "invalid envelope", m: Message{ID: nil, Error: &Error{Type: boxerr.ErrInvalidRequest.Type, Message: "bad"}},
			want: `{"seq_id":-1,"code":1,"message":"ValidationError: bad","data":{},"chunk_status":"continue"}`},
		{name: "permission", m: Message{ID: json.RawMessage("5"), Error: &Error{Type: "PermissionError", Message: "Stale Box placement generation"}},
			want: `{"seq_id":5,"code":1,"message":"PermissionError: Stale Box placement generation","data":{},"chunk_status":"continue"}`},
		{name: "error text cut at 4096 characters", m: Message{ID: json.RawMessage("6"), Error: &Error{Type: "BoxError", Message: long}},
			want: `{"seq_id":6,"code":1,"message":"BoxError: ` + strings.Repeat("é", 4096) + `... [protocol error truncated]","data":{},"chunk_status":"continue"}`},
		{name: "html not escaped", m: Message{ID: json.RawMessage("7"), Error: &Error{Type: "BoxError", Message: "<a>&\"\n"}},
			want: `{"seq_id":7,"code":1,"message":"BoxError: <a>&\"\n","data":{},"chunk_status":"continue"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, stdio := range []bool{true, false} {
				frames, err := NewLangBot(stdio).Encode(nil, tc.m)
				require.NoError(t, err)
				if len(tc.want) <= LangBotChunkBytes || !stdio {
					require.Len(t, frames, 1)
					assert.Equal(t, tc.want, string(frames[0]))
				}
				assert.True(t, json.Valid([]byte(tc.want)))
			}
		})
	}
	frames, err := NewLangBot(true).Encode(nil, Message{Method: "notify", Params: json.RawMessage("{}")})
	require.NoError(t, err)
	assert.Empty(t, frames, "notifications have no place in the envelope")
}

// reassemble is the host's receiver: it checks every rule the reference
// checks and returns the message.
func reassemble(t *testing.T, frames [][]byte) []byte {
	t.Helper()
	var start struct {
		Type      string `json:"type"`
		TotalSize int    `json:"total_size"`
	}
	require.NoError(t, json.Unmarshal(frames[0], &start))
	require.Equal(t, "chunk_start", start.Type)
	var msg []byte
	for i, f := range frames[1:] {
		require.Less(t, len(f)+1, 64<<10, "physical line %d is %d bytes", i+1, len(f)+1)
		var c struct {
			Type   string `json:"type"`
			Data   string `json:"data"`
			Offset int    `json:"offset"`
		}
		require.NoError(t, json.Unmarshal(f, &c))
		if c.Type == "chunk_end" {
			require.Equal(t, len(frames)-2, i, "chunk_end is the last line")
			break
		}
		require.Equal(t, "chunk_data", c.Type)
		require.Equal(t, len(msg), c.Offset)
		require.LessOrEqual(t, len(c.Data), LangBotChunkBytes)
		msg = append(msg, c.Data...)
	}
	require.Equal(t, start.TotalSize, len(msg))
	return msg
}

func TestLangBotChunking(t *testing.T) {
	// A result whose message text is exactly at and just over the limit.
	overhead := len(`{"seq_id":1,"code":0,"message":"success","data":{"s":""},"chunk_status":"continue"}`)
	tests := []struct {
		name    string
		payload string
		chunked bool
	}{
		{name: "exactly 16384 bytes is one line", payload: strings.Repeat("a", LangBotChunkBytes-overhead)},
		{name: "16385 bytes is chunked", payload: strings.Repeat("a", LangBotChunkBytes-overhead+1), chunked: true},
		{name: "html doubles at most", payload: strings.Repeat(`<&>\"`, 40000), chunked: true},
		{name: "code points never split", payload: strings.Repeat("a€😀", 30000), chunked: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal(map[string]string{"s": tc.payload})
			require.NoError(t, err)
			frames, err := NewLangBot(true).Encode(nil, Message{ID: json.RawMessage("1"), Result: data})
			require.NoError(t, err)
			if !tc.chunked {
				require.Len(t, frames, 1)
				assert.Len(t, frames[0], LangBotChunkBytes)
				return
			}
			msg := reassemble(t, frames)
			var got struct {
				Data struct{ S string } `json:"data"`
			}
			require.NoError(t, json.Unmarshal(msg, &got))
			assert.Equal(t, tc.payload, got.Data.S)

			// The codec reads its own chunk lines back (the host chunks
			// large requests the same way).
			req := strings.Replace(string(msg), `"code":0,"message":"success",`, `"action":"echo",`, 1)
			lines := chunkLines(nil, []byte(req))
			in := NewLangBot(true)
			var decoded *Request
			for i, l := range lines {
				r, err := decode(in, l)
				require.NoError(t, err)
				if i < len(lines)-1 {
					require.Nil(t, r)
				}
				decoded = r
			}
			require.NotNil(t, decoded)
			assert.Equal(t, "echo", decoded.Method)
			assert.JSONEq(t, string(data), string(decoded.Params))
		})
	}
}

func TestLangBotChunkedRequestRefusals(t *testing.T) {
	start := `{"type":"chunk_start","total_size":5}`
	tests := []struct {
		name  string
		lines []string
		want  string
	}{
		{name: "total_size not an integer", lines: []string{`{"type":"chunk_start","total_size":"x"}`}, want: "chunk_start total_size"},
		{name: "total_size over 16 MiB", lines: []string{fmt.Sprintf(`{"type":"chunk_start","total_size":%d}`, MaxMessageBytes+1)}, want: "chunk_start total_size"},
		{name: "offset gap", lines: []string{start, `{"type":"chunk_data","data":"ab","offset":1}`}, want: "chunk_data offset must be 0"},
		{name: "over total_size", lines: []string{start, `{"type":"chunk_data","data":"abcdef","offset":0}`}, want: "exceeds its total_size"},
		{name: "short at chunk_end", lines: []string{start, `{"type":"chunk_data","data":"ab","offset":0}`, `{"type":"chunk_end"}`}, want: "ended after 2 of 5"},
		{name: "fragment amplification", lines: append([]string{start}, strings.Split(strings.Repeat(`{"type":"chunk_data","data":"","offset":0}`+"\n", langBotMaxFragments+1), "\n")...), want: "exceeds 4096 fragments"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewLangBot(true)
			var last error
			for _, l := range tc.lines {
				if _, err := decode(c, []byte(l)); err != nil {
					last = err
					break
				}
			}
			var de *DecodeError
			require.ErrorAs(t, last, &de)
			assert.Equal(t, "-1", string(de.ID))
			assert.Contains(t, de.Err.Message, tc.want)
			// The connection goes on: the next request is read.
			req, err := decode(c, []byte(`{"seq_id":9,"action":"__ping","data":{}}`))
			require.NoError(t, err)
			require.NotNil(t, req)
			assert.Equal(t, "__ping", req.Method)
		})
	}
}

func BenchmarkLangBotDecode(b *testing.B) {
	frames := map[string][]byte{
		"ping":         []byte(`{"seq_id": 41001, "action": "__ping", "data": {}}`),
		"with context": []byte(`{"seq_id": 41001, "action": "box_status", "data": {}, "context": {"instance_uuid": "instance-a", "workspace_uuid": "workspace-a", "placement_generation": 1}}`),
		"jsonrpc ping": []byte(`{"jsonrpc":"2.0","id":41001,"method":"__ping","params":{}}`),
	}
	for name, f := range frames {
		b.Run(name, func(b *testing.B) {
			var c Codec = NewLangBot(true)
			if strings.HasPrefix(name, "jsonrpc") {
				c = JSONRPC{}
			}
			var req Request
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Decode(f, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
