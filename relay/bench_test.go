package relay

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// BenchmarkRelayStream measures stdout lines relayed as frames per second:
// the process writes many short lines at once (as `yes` does), the client
// reads one frame per line.
func BenchmarkRelayStream(b *testing.B) {
	e := newEnv(b, "")
	p, tok := e.start("s1", "p1")
	line := []byte(`{"jsonrpc":"2.0"}` + "\n")
	chunk := bytes.Repeat(line, 4096/len(line))
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := p.out.Write(chunk); err != nil {
				return
			}
		}
	}()
	c, _ := e.dial("s1", "p1", tok)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, _, err := c.Read(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	close(stop)
	c.Close(websocket.StatusNormalClosure, "")
	p.exit(0)
}
