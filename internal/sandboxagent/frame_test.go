package sandboxagent

import (
	"bytes"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFrameBufferFollowsFrames: short and long frames (up to maxFrame),
// arriving in pieces, are read whole and in order; a long frame grows the
// read buffer and the next call gives it back.
func TestFrameBufferFollowsFrames(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	r, w := newFrameConn(conn(fds[0]), false), conn(fds[1])
	frames := [][]byte{[]byte(`{"a":1}`), bytes.Repeat([]byte("x"), maxFrame), []byte(`{"b":2}`),
		bytes.Repeat([]byte("y"), minFrameBuf+1), bytes.Repeat([]byte("z"), minFrameBuf-4)}
	var stream []byte
	for _, f := range frames {
		stream = append(stream, byte(len(f)>>24), byte(len(f)>>16), byte(len(f)>>8), byte(len(f)))
		stream = append(stream, f...)
	}
	go func() {
		// Odd pieces: frames and length prefixes split across reads.
		for len(stream) > 0 {
			n := min(len(stream), 3001)
			if _, err := w.Write(stream[:n]); err != nil {
				return
			}
			stream = stream[n:]
		}
	}()
	for i, want := range frames {
		got, err := r.readFrame()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: %d bytes, want %d", i, len(got), len(want))
		}
	}
	w.Close()
	if _, err := r.readFrame(); err == nil {
		t.Fatal("read past the end")
	}
	if len(r.buf) != minFrameBuf {
		t.Errorf("read buffer %d bytes after the long frames were consumed, want %d", len(r.buf), minFrameBuf)
	}
}
