package dialout

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
)

// The peer's stream messages are untrusted: any sequence is handled
// without a panic, and a stream never buffers past its window.
func FuzzMuxReceive(f *testing.F) {
	f.Add([]byte{frameOpen, 0, 0, 0, 1}, []byte{frameData, 0, 0, 0, 1, 'h', 'i'})
	f.Add([]byte{frameWindow, 0, 0, 0, 1, 0, 0, 1, 0}, []byte{frameFin, 0, 0, 0, 1})
	f.Add([]byte{frameReset, 0, 0, 0, 1}, []byte{9})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var accepted []*Stream
		m := newMux(context.Background(), func(context.Context, []byte) error { return nil },
			func(s *Stream) bool { accepted = append(accepted, s); return true })
		for _, msg := range [][]byte{a, b, a} {
			if err := m.receive(bytes.NewReader(msg)); err != nil {
				return // the link would be closed
			}
		}
		for _, s := range accepted {
			s.mu.Lock()
			n := s.in.Len()
			s.mu.Unlock()
			if n > StreamWindow {
				t.Fatalf("a stream buffers %d bytes, past its window", n)
			}
		}
		m.close()
	})
}

func FuzzFrameID(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":42,"result":{}}`))
	f.Add([]byte(`{"method":"m","params":{},"id":7,"jsonrpc":"2.0"}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"x","result":{}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":-,"result":{}}`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		if id := frameID(frame); id != nil && !json.Valid(id) {
			t.Fatalf("frameID(%q) = %q, not JSON", frame, id)
		}
	})
}
