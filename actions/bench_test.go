package actions

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/boxrt/boxrt/rpc"
)

// BenchmarkHandlePing is the method layer of a __ping: table lookup,
// params check, call, result encoding.
func BenchmarkHandlePing(b *testing.B) {
	d := New(nil, nil, Server{})
	req := &rpc.Request{Method: "__ping", Params: json.RawMessage("{}"), ID: json.RawMessage("1")}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Handle(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
