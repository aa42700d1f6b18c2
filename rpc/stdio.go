package rpc

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"sync"
)

// lineConn frames messages as newline-terminated lines.
type lineConn struct {
	r     *bufio.Reader
	w     *bufio.Writer
	out   io.Writer // under w, for frames written past it
	limit int
	line  []byte // reused for lines longer than the read buffer
	close func() error
	once  sync.Once
}

func newLineConn(r io.Reader, w io.Writer, limit int, closeFn func() error) *lineConn {
	return &lineConn{r: bufio.NewReaderSize(r, 64<<10), w: bufio.NewWriterSize(w, 64<<10), out: w, limit: limit, close: closeFn}
}

// ReadFrame returns the next non-empty line without its terminator, valid
// until the next call: a line that fits the read buffer is not copied. A
// line longer than the limit is discarded up to its newline — never held
// in memory whole — and reported as errFrameTooLarge so the caller can
// answer it and carry on with the next line.
func (c *lineConn) ReadFrame() ([]byte, error) {
	for {
		line, err := c.readLine()
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(line)) > 0 {
			return line, nil
		}
	}
}

func (c *lineConn) readLine() ([]byte, error) {
	chunk, err := c.r.ReadSlice('\n')
	if err == nil && len(chunk) <= c.limit+1 { // +1: the newline itself
		return bytes.TrimRight(chunk, "\r\n"), nil
	}
	line := c.line[:0]
	tooLarge := false
	for {
		if !tooLarge {
			if len(line)+len(chunk) > c.limit+1 {
				tooLarge = true
				line = line[:0]
			} else {
				line = append(line, chunk...)
			}
		}
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) && len(line) > 0 && !tooLarge {
				break
			}
			return nil, err
		}
		chunk, err = c.r.ReadSlice('\n')
	}
	if cap(line) <= 1<<20 {
		c.line = line // keep a modest buffer for the next long line
	}
	if tooLarge {
		return nil, errFrameTooLarge
	}
	return bytes.TrimRight(line, "\r\n"), nil
}

// More reports whether a whole line is already buffered.
func (c *lineConn) More() bool {
	n := c.r.Buffered()
	if n == 0 {
		return false
	}
	b, _ := c.r.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

// directFrameBytes: a frame at least this long is written from its own
// buffer, its newline appended in the frame's spare capacity (frames are
// the connection's, see frameConn), instead of being copied through the
// write buffer: streamed output's frames are ~64 KiB each, and one write
// per frame without the copy is the cheapest way to move them.
const directFrameBytes = 16 << 10

// WriteFrame buffers one line, or writes a long one at once after what is
// buffered; Flush sends what is buffered.
func (c *lineConn) WriteFrame(b []byte) error {
	if len(b) >= directFrameBytes && cap(b) > len(b) {
		if err := c.w.Flush(); err != nil {
			return err
		}
		_, err := c.out.Write(append(b, '\n'))
		return err
	}
	if _, err := c.w.Write(b); err != nil {
		return err
	}
	return c.w.WriteByte('\n')
}

func (c *lineConn) Flush() error { return c.w.Flush() }

func (c *lineConn) Close() error {
	var err error
	c.once.Do(func() {
		if c.close != nil {
			err = c.close()
		}
	})
	return err
}
