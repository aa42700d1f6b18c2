package actions

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
)

// outputSink notifies the request's connection of chunks, also after the
// request has returned (until the connection ends). Chunks already waiting
// go out in one write. A sink is called by one goroutine at a time, and
// the rpc layer copies the params, so one buffer serves every chunk.
func outputSink(ctx context.Context) runtime.ChunkSink {
	nctx := context.WithoutCancel(ctx)
	reqID := rpc.RequestIDFrom(ctx)
	var buf []byte
	return func(c runtime.ExecChunk) error {
		buf = appendOutputNotice(buf[:0], c, reqID)
		return rpc.NotifyJSON(nctx, OutputNotification, buf, c.More)
	}
}

// appendOutputNotice appends c as box_exec_output's params (the shape
// reconnect.OutputParams decodes): data is the chunk when it is valid
// UTF-8, else data_base64 (chunks are cut on character boundaries, so only
// output that is not text takes the base64 form); a last notice with eof
// and no data says the exec's output is complete. Streamed output is
// most of what boxrt sends, so the chunk is escaped and checked for UTF-8
// in one pass straight into the message, instead of encoding/json's
// validate, copy to a string, escape into a buffer and copy out.
func appendOutputNotice(b []byte, c runtime.ExecChunk, reqID json.RawMessage) []byte {
	b = slices.Grow(b, 160+len(c.Data)+len(c.Data)/8)
	b = append(b, `{"exec_id":`...)
	b, _ = appendJSONString(b, []byte(c.ExecID))
	if len(reqID) > 0 {
		b = append(b, `,"request_id":`...)
		b = append(b, reqID...)
	}
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, c.Seq, 10)
	if c.Stream != "" {
		b = append(b, `,"stream":`...)
		b, _ = appendJSONString(b, []byte(c.Stream))
	}
	b = append(b, `,"offset":`...)
	b = strconv.AppendInt(b, c.Offset, 10)
	switch {
	case c.EOF:
		b = append(b, `,"eof":true`...)
	default:
		mark := len(b)
		b = append(b, `,"data":`...)
		var text bool
		if b, text = appendJSONString(b, c.Data); !text {
			b = append(b[:mark], `,"data_base64":"`...)
			b = base64.StdEncoding.AppendEncode(b, c.Data)
			b = append(b, '"')
		}
	}
	return append(b, '}')
}

// jsonSafe marks the ASCII bytes a JSON string holds as they are.
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// specialBytes marks (with its high bit) each of 8 little-endian bytes
// that a JSON string does not hold as it is: a control character, a quote,
// a backslash, or a byte past ASCII (to be checked as UTF-8), all tested
// together: most output is plain text, and a byte at a time is the slow
// part of escaping it. The tests run on the low seven bits of each byte,
// where no sum carries into the next byte, so every mark is exact.
func specialBytes(x uint64) uint64 {
	const low7, highs = 0x7f7f7f7f7f7f7f7f, 0x8080808080808080
	const ones = 0x0101010101010101
	y := x & low7
	// Each sum sets a byte's high bit when the byte is at least 0x20, is
	// not a quote, is not a backslash.
	plain := (y + ones*(0x80-0x20)) & ((y ^ ones*'"') + low7) & ((y ^ ones*'\\') + low7)
	return (x | ^plain) & highs
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// does apart from its HTML escaping (<, >, & stay as they are, which is
// the same JSON). valid is false when s is not UTF-8; invalid bytes are
// then written as U+FFFD. Plain bytes are copied eight at a time as they
// are scanned, so text with a newline every few dozen bytes costs no
// copy call per line.
func appendJSONString(b, s []byte) (_ []byte, valid bool) {
	const hex = "0123456789abcdef"
	valid = true
	b = append(b, '"')
	for i := 0; i < len(s); {
		if i+8 <= len(s) {
			if cap(b)-len(b) < 8 {
				b = slices.Grow(b, 8+len(s)-i)
			}
			w := binary.LittleEndian.Uint64(s[i:])
			n := len(b)
			binary.LittleEndian.PutUint64(b[n:n+8], w)
			m := specialBytes(w)
			if m == 0 {
				b, i = b[:n+8], i+8
				continue
			}
			k := bits.TrailingZeros64(m) >> 3 // the plain bytes before the first special one
			b, i = b[:n+k], i+k
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case jsonSafe[c]:
				b = append(b, c)
			case c == '"', c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			valid = false
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			// Valid JSON, but line terminators to JavaScript.
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"'), valid
}
