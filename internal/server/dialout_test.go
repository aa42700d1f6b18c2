package server

import (
	"encoding/json"
	"testing"

	"github.com/boxrt/boxrt/internal/dialout"
	"github.com/boxrt/boxrt/rpc"
)

// The replay classes follow what the JSON-RPC codec writes: a change of
// its layout must not turn exec output into answers the buffer keeps.
func TestClassifyFrameFollowsTheCodec(t *testing.T) {
	enc := func(m rpc.Message) []byte {
		frames, err := rpc.JSONRPC{}.Encode(nil, m)
		if err != nil || len(frames) != 1 {
			t.Fatalf("encode: %v", err)
		}
		return frames[0]
	}
	if c := classifyFrame(enc(rpc.Message{Method: "box_exec_output", Params: json.RawMessage(`{"seq":1}`)})); c != dialout.Bulk {
		t.Error("a notification is Bulk")
	}
	if c := classifyFrame(enc(rpc.Message{Method: dialout.AnswersLostNotification, Params: json.RawMessage(`{"ids":[]}`)})); c != dialout.Keep {
		t.Error("box_answers_lost is kept like an answer")
	}
	if c := classifyFrame(enc(rpc.Message{ID: json.RawMessage(`7`), Result: json.RawMessage(`{}`)})); c != dialout.Keep {
		t.Error("an answer is Keep")
	}
	if c := classifyFrame(enc(rpc.Message{ID: json.RawMessage(`7`), Error: &rpc.Error{Code: -32602, Message: "x"}})); c != dialout.Keep {
		t.Error("an error answer is Keep")
	}
}
