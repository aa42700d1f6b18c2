package reconnect

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowOutput is the general path's reading of an output notification.
func slowOutput(t *testing.T, frame []byte) (string, bool, ExecOutput) {
	t.Helper()
	var m struct {
		Params OutputParams `json:"params"`
	}
	require.NoError(t, json.Unmarshal(frame, &m))
	var id string
	ours := json.Unmarshal(m.Params.RequestID, &id) == nil
	return id, ours, m.Params.Output()
}

func TestParseOutputFrame(t *testing.T) {
	for _, tc := range []struct {
		name, params string
		fast         bool // the fast path reads it (else the general path does)
	}{
		{"text", `{"exec_id":"x1","request_id":"stream-1","seq":3,"stream":"stdout","offset":16384,"data":"hello\n"}`, true},
		{"escapes", `{"exec_id":"x1","request_id":"stream-1","seq":3,"stream":"stdout","offset":0,"data":"a\"b\\c\/\n\r\t\b\f\u0001\u00e9\u2028<>&é"}`, true},
		{"empty data", `{"exec_id":"x1","request_id":"stream-1","seq":0,"stream":"stderr","offset":0,"data":""}`, true},
		{"base64", `{"exec_id":"x1","request_id":"stream-1","seq":1,"stream":"stdout","offset":5,"data_base64":"/w=="}`, true},
		{"eof", `{"exec_id":"x1","request_id":"stream-9","seq":7,"stream":"stdout","offset":9,"eof":true}`, true},
		{"no stream (a terminal)", `{"exec_id":"x1","request_id":"stream-1","seq":1,"offset":0,"data":"$ "}`, true},
		{"another client's number id", `{"exec_id":"x1","request_id":42,"seq":1,"stream":"stdout","offset":0,"data":"x"}`, true},
		{"no request id", `{"exec_id":"x1","seq":1,"stream":"stdout","offset":0,"data":"x"}`, true},
		{"surrogate pair: general path", `{"exec_id":"x1","request_id":"stream-1","seq":1,"stream":"stdout","offset":0,"data":"\ud83d\ude00"}`, false},
		{"other order: general path", `{"seq":1,"exec_id":"x1","request_id":"stream-1","stream":"stdout","offset":0,"data":"x"}`, false},
		{"extra member: general path", `{"exec_id":"x1","request_id":"stream-1","seq":1,"stream":"stdout","offset":0,"data":"x","more":1}`, false},
		{"bad base64: general path", `{"exec_id":"x1","request_id":"stream-1","seq":1,"stream":"stdout","offset":0,"data_base64":"!!"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frame := []byte(`{"jsonrpc":"2.0","method":"box_exec_output","params":` + tc.params + `}`)
			require.True(t, json.Valid(frame))
			n, ok := parseOutputFrame(frame)
			require.Equal(t, tc.fast, ok)
			if !ok {
				return
			}
			id, ours, want := slowOutput(t, frame)
			assert.Equal(t, want, n.out)
			assert.Equal(t, ours, n.ours)
			assert.Equal(t, id, n.requestID)
			assert.JSONEq(t, tc.params, string(n.params))
		})
	}
}

// TestParseOutputFrameRandom: random chunks, as encoding/json writes them,
// read the same on both paths.
func TestParseOutputFrameRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("ab \n\t\"\\/<>&\x00\x1fé€\u2028")
	for range 500 {
		r := make([]rune, rng.IntN(200))
		for i := range r {
			r[i] = alphabet[rng.IntN(len(alphabet))]
		}
		data := string(r)
		p := OutputParams{ExecID: "e", Seq: 1, Stream: "stdout", Data: &data}
		ordered := `{"exec_id":"e","request_id":"stream-1","seq":1,"stream":"stdout","offset":0,"data":` + string(mustJSON(t, data)) + `}`
		n, ok := parseOutputFrame([]byte(`{"jsonrpc":"2.0","method":"box_exec_output","params":` + ordered + `}`))
		require.True(t, ok, ordered)
		assert.Equal(t, p.Output(), n.out)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// BenchmarkOutputDecode compares the fast path with the general one on a
// 64 KiB chunk of text, as boxrt streams a command's output.
func BenchmarkOutputDecode(b *testing.B) {
	data := string(bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz\n"), 65536/37))
	frame := []byte(`{"jsonrpc":"2.0","method":"box_exec_output","params":{"exec_id":"x1","request_id":"stream-1","seq":3,"stream":"stdout","offset":65536,"data":` +
		string(mustJSONB(data)) + `}}`)
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for range b.N {
			if _, ok := parseOutputFrame(frame); !ok {
				b.Fatal("not read")
			}
		}
	})
	b.Run("general", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for range b.N {
			var env struct {
				Params json.RawMessage `json:"params"`
			}
			if !json.Valid(frame) || json.Unmarshal(frame, &env) != nil {
				b.Fatal("invalid")
			}
			var p OutputParams
			if json.Unmarshal(env.Params, &p) != nil {
				b.Fatal("invalid params")
			}
			_ = p.Output()
		}
	})
}

func mustJSONB(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
