package sandboxagent

import (
	"errors"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// drainMax bounds what is read from an output once its drain deadline has
// passed: the most a pipe holds (fs.pipe-max-size, which an unprivileged
// command cannot raise), so everything the exited command wrote is taken
// while a background process that keeps writing cannot hold the exec open.
const drainMax = 1 << 20

// DrainReader reads a command's output pipe (or terminal master) in the
// runtime's poller. Its owner sets F's read deadline when the command
// exits; from then on a read takes what the pipe holds without waiting for
// more, so output still buffered at the exit is never lost to a slow
// consumer, and a background process that holds the pipe open cannot keep
// the reader waiting.
type DrainReader struct {
	F        *os.File
	draining bool
	drained  int
}

// Read reads like F.Read until the deadline, then only what F holds now;
// an empty pipe is io.EOF.
func (d *DrainReader) Read(b []byte) (int, error) {
	if !d.draining {
		n, err := d.F.Read(b)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		// A read that comes after the deadline fails before it looks.
		d.draining = true
	}
	if d.drained >= drainMax {
		return 0, io.EOF
	}
	n, err := readNow(d.F, b[:min(len(b), drainMax-d.drained)])
	d.drained += n
	return n, err
}

// readNow reads what f holds now; nothing is io.EOF. It clears f's read
// deadline, which the raw read would otherwise check first.
func readNow(f *os.File, b []byte) (int, error) {
	raw, err := f.SyscallConn()
	if err == nil {
		err = f.SetReadDeadline(time.Time{})
	}
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		n, rerr = unix.Read(int(fd), b)
		return true // never wait
	}); err != nil {
		return 0, err
	}
	if rerr != nil || n <= 0 {
		return 0, io.EOF
	}
	return n, nil
}
