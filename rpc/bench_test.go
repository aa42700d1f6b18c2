package rpc

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// The benchmarks split a __ping's cost in the server by layer (see
// docs/benchmarks.md, "where the time goes"); syscalls are not included.

var pingFrame = []byte(`{"jsonrpc":"2.0","id":12345,"method":"__ping","params":{}}`)

func BenchmarkJSONRPCDecode(b *testing.B) {
	var req Request
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (JSONRPC{}).Decode(pingFrame, &req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJSONRPCEncode(b *testing.B) {
	m := Message{ID: json.RawMessage("12345"), Result: json.RawMessage("{}")}
	var frames [][]byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if frames, err = (JSONRPC{}).Encode(frames[:0], m); err != nil {
			b.Fatal(err)
		}
		recycleFrame(frames[0]) // as the loop does once the frame is written
	}
}

// BenchmarkServeInline is the whole frame loop per call — read, decode,
// dispatch inline, encode, queue, write — for a buffered burst of pings
// with a handler that does nothing.
func BenchmarkServeInline(b *testing.B) {
	const burst = 1000
	in := strings.Repeat(string(pingFrame)+"\n", burst)
	h := funcHandler(func(context.Context, *Request) (json.RawMessage, error) { return nil, nil })
	s := NewServer(h, WithInline("__ping"))
	b.ReportAllocs()
	for b.Loop() {
		s.ServeStdio(context.Background(), strings.NewReader(in), io.Discard)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*burst), "ns/call")
}
