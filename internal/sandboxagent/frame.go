package sandboxagent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// maxFrame bounds a frame's JSON, both ways.
	maxFrame = 64 << 10
	// minFrameBuf is a connection's read buffer while its frames are
	// small, as nearly all are (output never flows through the agent): a
	// buffer of maxFrame per connection was most of the memory a running
	// session costs boxrt. It grows for a longer frame and comes back
	// once that frame is consumed.
	minFrameBuf = 4 << 10
	// maxFDs is the most descriptors a frame carries (stdin, stdout, stderr).
	maxFDs = 3
	// writeTimeout bounds a write: a peer that stops reading does not
	// hold a writer forever.
	writeTimeout = 5 * time.Second
)

// frameConn reads and writes frames (4-byte big-endian length, then that
// many bytes of JSON) on one unix stream socket, with descriptors as
// SCM_RIGHTS on a frame's bytes.
type frameConn struct {
	c *net.UnixConn
	// acceptFDs: received descriptors queue up in fds for the reader to
	// claim (the agent); otherwise they are closed and are a protocol error
	// (the host).
	acceptFDs bool
	fds       []int

	buf        []byte // buf[start:end] is read and not yet consumed
	start, end int
	oob        []byte

	wmu sync.Mutex
}

func newFrameConn(c *net.UnixConn, acceptFDs bool) *frameConn {
	return &frameConn{
		c:         c,
		acceptFDs: acceptFDs,
		buf:       make([]byte, minFrameBuf),
		oob:       make([]byte, unix.CmsgSpace(4*maxFDs)),
	}
}

// errTruncated is a connection that ended inside a frame.
var errTruncated = errors.New("connection ended inside a frame")

// readFrame returns the next frame's JSON, valid until the next call. A
// frame that breaks the format is a *ProtocolError; the connection's end is
// io.EOF (or errTruncated, or the read's error).
func (f *frameConn) readFrame() ([]byte, error) {
	if f.start == f.end && len(f.buf) > minFrameBuf {
		// The long frame was consumed (its payload is the caller's until
		// this call).
		f.buf, f.start, f.end = make([]byte, minFrameBuf), 0, 0
	}
	for {
		need := 4
		if f.end-f.start >= 4 {
			n := binary.BigEndian.Uint32(f.buf[f.start:])
			if n == 0 || n > maxFrame {
				return nil, &ProtocolError{Reason: fmt.Sprintf("frame length %d is outside 1..%d", n, maxFrame)}
			}
			if f.end-f.start >= 4+int(n) {
				payload := f.buf[f.start+4 : f.start+4+int(n)]
				f.start += 4 + int(n)
				return payload, nil
			}
			need = 4 + int(n)
		}
		switch {
		case need > len(f.buf):
			grown := make([]byte, 4+maxFrame)
			f.end = copy(grown, f.buf[f.start:f.end])
			f.buf, f.start = grown, 0
		case f.start > 0:
			f.end = copy(f.buf, f.buf[f.start:f.end])
			f.start = 0
		}
		if err := f.fill(); err != nil {
			if errors.Is(err, io.EOF) && f.end > 0 {
				return nil, errTruncated
			}
			return nil, err
		}
	}
}

// fill reads what the socket has into buf, with the descriptors sent
// along.
func (f *frameConn) fill() error {
	n, oobn, flags, _, err := f.c.ReadMsgUnix(f.buf[f.end:], f.oob)
	f.end += n
	if ferr := f.takeFDs(f.oob[:oobn], flags); ferr != nil {
		return ferr
	}
	if err != nil {
		return err
	}
	if n == 0 {
		return io.EOF
	}
	return nil
}

// takeFDs queues or closes the descriptors in a control message. Go's
// ReadMsgUnix receives them close-on-exec, so none leaks into a child
// in between.
func (f *frameConn) takeFDs(oob []byte, flags int) error {
	var fds []int
	if len(oob) > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob)
		if err != nil {
			return &ProtocolError{Reason: "unreadable control message: " + err.Error()}
		}
		for _, m := range msgs {
			rights, err := unix.ParseUnixRights(&m)
			if err != nil {
				closeFDs(fds)
				return &ProtocolError{Reason: "control message other than descriptors"}
			}
			fds = append(fds, rights...)
		}
	}
	switch {
	case flags&unix.MSG_CTRUNC != 0:
		// The kernel closed what did not fit.
		closeFDs(fds)
		return &ProtocolError{Reason: fmt.Sprintf("more than %d descriptors sent with a frame", maxFDs)}
	case len(fds) > 0 && !f.acceptFDs:
		closeFDs(fds)
		return &ProtocolError{Reason: fmt.Sprintf("the agent sent %d file descriptor(s); it may send none (closed)", len(fds))}
	case len(f.fds)+len(fds) > 4*maxFDs:
		closeFDs(fds)
		return &ProtocolError{Reason: "descriptors sent without the frames that claim them"}
	}
	f.fds = append(f.fds, fds...)
	return nil
}

// claimFDs takes the n oldest received descriptors, those sent with the
// frame just read (they arrive no later than its first byte).
func (f *frameConn) claimFDs(n int) ([]int, error) {
	if len(f.fds) < n {
		return nil, &ProtocolError{Reason: fmt.Sprintf("frame wants %d descriptors, %d were sent", n, len(f.fds))}
	}
	fds := append([]int(nil), f.fds[:n]...)
	f.fds = f.fds[n:]
	return fds, nil
}

// writeFrame sends payload as one frame, with fds on its bytes.
func (f *frameConn) writeFrame(payload []byte, fds []int) error {
	if len(payload) == 0 || len(payload) > maxFrame {
		return fmt.Errorf("frame of %d bytes is outside 1..%d", len(payload), maxFrame)
	}
	b := make([]byte, 4+len(payload))
	binary.BigEndian.PutUint32(b, uint32(len(payload)))
	copy(b[4:], payload)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	f.wmu.Lock()
	defer f.wmu.Unlock()
	if err := f.c.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return err
	}
	n, _, err := f.c.WriteMsgUnix(b, oob, nil)
	if err == nil && n < len(b) {
		// A stream socket may take part of it; the descriptors went
		// with the first part.
		_, err = f.c.Write(b[n:])
	}
	return err
}

// dropFDs closes the received descriptors nobody claimed; the reader
// calls it once it is done.
func (f *frameConn) dropFDs() {
	closeFDs(f.fds)
	f.fds = nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
