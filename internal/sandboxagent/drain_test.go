package sandboxagent

import (
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDrainReader: after the deadline, what the pipe holds is read however
// slowly the reader goes, an empty pipe ends the read although a writer
// still holds it open, and a writer that never stops is read no further
// than drainMax.
func TestDrainReader(t *testing.T) {
	cases := []struct {
		name      string
		buffered  int
		keepUp    bool // a writer goes on writing after the deadline
		pause     time.Duration
		wantMin   int
		wantAtMax int
	}{
		{name: "buffered output read by a slow reader", buffered: 60 << 10, pause: 50 * time.Millisecond, wantMin: 60 << 10, wantAtMax: 60 << 10},
		{name: "empty pipe held open", wantAtMax: 0},
		{name: "endless writer", buffered: 4 << 10, keepUp: true, pause: time.Millisecond, wantMin: 4 << 10, wantAtMax: drainMax},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
				t.Fatal(err)
			}
			// The write end blocks, so the endless writer refills the pipe
			// as fast as it is read.
			if err := unix.SetNonblock(p[1], false); err != nil {
				t.Fatal(err)
			}
			r, w := os.NewFile(uintptr(p[0]), "r"), os.NewFile(uintptr(p[1]), "w")
			defer r.Close()
			if _, err := w.Write(make([]byte, tc.buffered)); err != nil {
				t.Fatal(err)
			}
			if tc.keepUp {
				// It ends when the reader's close breaks the pipe.
				go func() {
					defer w.Close()
					for {
						if _, err := w.Write(make([]byte, 4<<10)); err != nil {
							return
						}
					}
				}()
			} else {
				defer w.Close()
			}
			if err := r.SetReadDeadline(time.Now()); err != nil {
				t.Fatal(err)
			}
			d := &DrainReader{F: r}
			got, buf := 0, make([]byte, 16<<10)
			for {
				time.Sleep(tc.pause)
				n, err := d.Read(buf)
				got += n
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if got < tc.wantMin || got > tc.wantAtMax {
				t.Fatalf("read %d bytes, want %d to %d", got, tc.wantMin, tc.wantAtMax)
			}
		})
	}
}
