package actions

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
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

// BenchmarkOutputSink is the server's cost per streamed 16 KiB chunk of
// text output: box_exec_output encoding, framing and the buffered write
// (to io.Discard, so no syscall).
func BenchmarkOutputSink(b *testing.B) {
	line := "0123456789abcdefghijklmnopqrstuvwxyz\n"
	chunk := []byte(strings.Repeat(line, runtime.ExecChunkBytes/len(line)+1)[:runtime.ExecChunkBytes])
	h := handlerFunc(func(ctx context.Context, _ *rpc.Request) (json.RawMessage, error) {
		sink := outputSink(ctx)
		b.SetBytes(int64(len(chunk)))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := sink(runtime.ExecChunk{ExecID: "x-0123456789abcdef01234567", Seq: int64(i), Stream: runtime.StreamStdout,
				Offset: int64(i * len(chunk)), Data: chunk, More: i%4 != 3}); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		return nil, nil
	})
	rpc.NewServer(h, rpc.WithInline("box_exec")).ServeStdio(context.Background(),
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"box_exec","params":{}}`+"\n"), io.Discard)
}

type handlerFunc func(context.Context, *rpc.Request) (json.RawMessage, error)

func (f handlerFunc) Handle(ctx context.Context, r *rpc.Request) (json.RawMessage, error) {
	return f(ctx, r)
}
