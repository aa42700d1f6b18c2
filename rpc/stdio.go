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
	limit int
	close func() error
	once  sync.Once
}

func newLineConn(r io.Reader, w io.Writer, limit int, closeFn func() error) *lineConn {
	return &lineConn{r: bufio.NewReaderSize(r, 64<<10), w: bufio.NewWriterSize(w, 64<<10), limit: limit, close: closeFn}
}

// ReadFrame returns the next non-empty line without its terminator. A line
// longer than the limit is discarded up to its newline — never held in
// memory whole — and reported as errFrameTooLarge so the caller can answer
// it and carry on with the next line.
func (c *lineConn) ReadFrame() ([]byte, error) {
	for {
		var line []byte
		tooLarge := false
		for {
			chunk, err := c.r.ReadSlice('\n')
			if !tooLarge {
				if len(line)+len(chunk) > c.limit+1 { // +1: the newline itself
					tooLarge = true
					line = nil
				} else {
					line = append(line, chunk...)
				}
			}
			if err == nil {
				break
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if errors.Is(err, io.EOF) && len(line) > 0 && !tooLarge {
				return bytes.TrimRight(line, "\r\n"), nil
			}
			return nil, err
		}
		if tooLarge {
			return nil, errFrameTooLarge
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		return line, nil
	}
}

// WriteFrame writes one line and flushes it, so a host reading line by line
// never waits on a buffer.
func (c *lineConn) WriteFrame(b []byte) error {
	if _, err := c.w.Write(b); err != nil {
		return err
	}
	if err := c.w.WriteByte('\n'); err != nil {
		return err
	}
	return c.w.Flush()
}

func (c *lineConn) Close() error {
	var err error
	c.once.Do(func() {
		if c.close != nil {
			err = c.close()
		}
	})
	return err
}
