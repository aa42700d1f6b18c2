package reconnect

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// outputPrefix is how boxrt begins every exec output notification.
var outputPrefix = []byte(`{"jsonrpc":"2.0","method":"` + OutputNotification + `","params":`)

// outputNotice is a box_exec_output notification read by parseOutputFrame:
// the chunk, the id of the request it belongs to, and its params as they
// came (for WithOnNotification).
type outputNotice struct {
	params    json.RawMessage
	requestID string
	// ours: the request id is a string, as the ids CallStream picks are.
	ours bool
	out  ExecOutput
}

// parseOutputFrame reads frame as an exec output notification laid out
// exactly as boxrt writes one — the envelope, then exec_id, request_id,
// seq, stream, offset, and data, data_base64 or eof, in that order — in
// one pass that decodes the data straight into the chunk. Streamed output
// is most of what a host reads, and the general path (validate, decode the
// envelope, decode the params, copy the string to bytes) is four passes
// over every byte. Anything else, or anything it does not fully
// understand, is !ok and takes the general path, which gives the same
// result.
func parseOutputFrame(frame []byte) (n outputNotice, ok bool) {
	if !bytes.HasPrefix(frame, outputPrefix) || len(frame) < len(outputPrefix)+2 || frame[len(frame)-1] != '}' {
		return n, false
	}
	p := frame[len(outputPrefix) : len(frame)-1]
	n.params = p
	r := outputReader{b: p}
	var execID, stream []byte
	ok = r.lit(`{"exec_id":`) && r.str(&execID, true)
	if ok && r.lit(`,"request_id":`) {
		ok = r.requestID(&n)
	}
	ok = ok && r.lit(`,"seq":`) && r.int(&n.out.Seq)
	if ok && r.lit(`,"stream":`) {
		ok = r.str(&stream, true)
	}
	ok = ok && r.lit(`,"offset":`) && r.int(&n.out.Offset)
	switch {
	case !ok:
	case r.lit(`,"eof":true`):
		n.out.EOF = true
	case r.lit(`,"data":`):
		// Unescaping never lengthens: what is left of the params bounds
		// the data, so it is decoded into one array of about its size.
		n.out.Data = make([]byte, 0, len(p)-r.i)
		ok = r.str(&n.out.Data, true)
	case r.lit(`,"data_base64":`):
		var enc []byte
		if ok = r.str(&enc, false); ok {
			dec := make([]byte, base64.StdEncoding.DecodedLen(len(enc)))
			k, err := base64.StdEncoding.Decode(dec, enc)
			n.out.Data, ok = dec[:k], err == nil
		}
	default:
		ok = false
	}
	if !ok || !r.lit(`}`) || r.i != len(p) {
		return outputNotice{}, false
	}
	n.out.ExecID, n.out.Stream = string(execID), string(stream)
	return n, true
}

// outputReader walks the params of one notification.
type outputReader struct {
	b []byte
	i int
}

// lit consumes s if it comes next.
func (r *outputReader) lit(s string) bool {
	if !bytes.HasPrefix(r.b[r.i:], []byte(s)) {
		return false
	}
	r.i += len(s)
	return true
}

// int reads a JSON integer.
func (r *outputReader) int(v *int64) bool {
	j := r.i
	if j < len(r.b) && r.b[j] == '-' {
		j++
	}
	for j < len(r.b) && r.b[j] >= '0' && r.b[j] <= '9' {
		j++
	}
	n, err := strconv.ParseInt(string(r.b[r.i:j]), 10, 64)
	if err != nil {
		return false
	}
	*v, r.i = n, j
	return true
}

// requestID reads the request id: a string (ours) or a number (another
// client's), kept for routing.
func (r *outputReader) requestID(n *outputNotice) bool {
	if r.i < len(r.b) && r.b[r.i] == '"' {
		var id []byte
		if !r.str(&id, true) {
			return false
		}
		n.requestID, n.ours = string(id), true
		return true
	}
	var ignored int64
	return r.int(&ignored)
}

// str reads a JSON string, unescaped, appending to *dst. Control bytes,
// a lone surrogate and (when text) bytes that are not UTF-8 make it fail:
// the general path decides what those mean. Plain bytes are skipped eight
// at a time: output is mostly plain text, a byte at a time was most of a
// client's CPU for a fast stream, and text that stays ASCII is not
// checked for UTF-8 a second time.
func (r *outputReader) str(dst *[]byte, text bool) bool {
	b, i := r.b, r.i
	if i >= len(b) || b[i] != '"' {
		return false
	}
	i++
	out := *dst
	start := i
	var high uint64 // the bytes' high bits, ORed: zero while all are ASCII
	for i < len(b) {
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			if m := stringStops(w); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			high |= w
			i += 8
		}
		if i >= len(b) {
			break
		}
		if !stringSpecial[b[i]] {
			high |= uint64(b[i])
			i++
			continue
		}
		switch c := b[i]; {
		case c == '"':
			out = append(out, b[start:i]...)
			if text && high&highBits != 0 && !utf8.Valid(out[len(*dst):]) {
				return false
			}
			*dst, r.i = out, i+1
			return true
		case c == '\\':
			out = append(out, b[start:i]...)
			var ok bool
			if out, i, ok = unescape(out, b, i); !ok {
				return false
			}
			// What an escape stands for is valid UTF-8 (a lone surrogate
			// fails above), so it needs no check.
			start = i
		default: // a control byte
			return false
		}
	}
	return false
}

const highBits = 0x8080808080808080

// stringStops marks (with its high bit) each of 8 little-endian bytes that
// ends a run of a JSON string's plain bytes: a quote, a backslash or a
// control byte. A borrow may also mark bytes after a marked one, never
// before, so the lowest mark is exactly the first such byte.
func stringStops(x uint64) uint64 {
	const ones = 0x0101010101010101
	zero := func(v uint64) uint64 { return (v - ones) &^ v & highBits }
	return ((x - ones*0x20) &^ x & highBits) | zero(x^(ones*'"')) | zero(x^(ones*'\\'))
}

// stringSpecial marks the bytes that end a run of a JSON string's plain
// bytes: the quote, the backslash and control bytes.
var stringSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// unescape appends the escape at b[i] ('\\') and returns the index after
// it.
func unescape(out, b []byte, i int) ([]byte, int, bool) {
	if i+1 >= len(b) {
		return out, i, false
	}
	switch c := b[i+1]; c {
	case '"', '\\', '/':
		return append(out, c), i + 2, true
	case 'n':
		return append(out, '\n'), i + 2, true
	case 'r':
		return append(out, '\r'), i + 2, true
	case 't':
		return append(out, '\t'), i + 2, true
	case 'b':
		return append(out, '\b'), i + 2, true
	case 'f':
		return append(out, '\f'), i + 2, true
	case 'u':
		if i+6 > len(b) {
			return out, i, false
		}
		v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		if err != nil || utf16.IsSurrogate(rune(v)) {
			return out, i, false
		}
		return utf8.AppendRune(out, rune(v)), i + 6, true
	}
	return out, i, false
}
