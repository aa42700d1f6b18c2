package rpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// The LangBot action-RPC envelope's numbers, as the unchanged host (SDK
// 0.5.5 and the 4.11 line) expects them.
const (
	// LangBotChunkBytes: an outbound stdio message longer than this goes as
	// chunk_start / chunk_data… / chunk_end lines, each piece at most this
	// many bytes of the message.
	LangBotChunkBytes = 16384
	// langBotMaxFragments bounds the lines of one inbound chunked message.
	langBotMaxFragments = 4096
	// langBotMaxErrorChars: an error text longer than this many characters
	// is cut and marked, as the reference does.
	langBotMaxErrorChars = 4096
	langBotTruncated     = "... [protocol error truncated]"
)

// LangBot is the codec of LangBot's action-RPC envelope: requests
// {"seq_id", "action", "data", "context"?}, answers {"seq_id", "code",
// "message", "data", "chunk_status"}. On stdio it also frames: messages
// over LangBotChunkBytes are sent and received as chunk lines, so no
// physical line reaches the host's 64 KiB reader limit. It keeps the
// reassembly state of one connection, so each connection needs its own
// (NewLangBot); Encode keeps no state and is safe for concurrent use.
type LangBot struct {
	stdio bool

	// Reassembly of an inbound chunked message (stdio only).
	assembling bool
	total      int
	fragments  int
	buf        []byte
}

// NewLangBot returns the codec for one connection; stdio turns on the
// chunk framing (a WebSocket carries one action message per text message).
func NewLangBot(stdio bool) *LangBot { return &LangBot{stdio: stdio} }

// lbFrame is any line the peer may send: an action message or a chunk
// control line. Members are kept raw and checked by hand, so that each
// wrong type is named in the ValidationError.
type lbFrame struct {
	Type      json.RawMessage `json:"type"`
	TotalSize json.RawMessage `json:"total_size"`
	Offset    json.RawMessage `json:"offset"`
	SeqID     json.RawMessage `json:"seq_id"`
	Action    json.RawMessage `json:"action"`
	Data      json.RawMessage `json:"data"`
	Context   json.RawMessage `json:"context"`
	Code      json.RawMessage `json:"code"`
}

// langBotNoID is the seq_id of an answer to a request that had none.
var langBotNoID = json.RawMessage("-1")

// Decode reads one line (stdio) or message (WebSocket). As in the
// reference, what cannot be a message is skipped without an answer: a line
// that does not start with '{' and end with '}', text that is not JSON, a
// JSON value that is not an object, an object with neither "action" nor
// "code", and every response (an object with "code").
func (l *LangBot) Decode(frame []byte, req *Request) (bool, error) {
	r, err := l.decode(frame)
	if r == nil || err != nil {
		return false, err
	}
	*req = *r
	return true, nil
}

func (l *LangBot) decode(frame []byte) (*Request, error) {
	trimmed := bytes.TrimSpace(frame)
	if len(trimmed) < 2 || trimmed[0] != '{' || trimmed[len(trimmed)-1] != '}' {
		if l.assembling {
			return l.countFragment()
		}
		return nil, nil
	}
	var f lbFrame
	if !utf8.Valid(trimmed) || json.Unmarshal(trimmed, &f) != nil {
		if l.assembling {
			return l.countFragment()
		}
		return nil, nil
	}
	if l.stdio && f.Type != nil {
		typ, _ := jsonString(f.Type)
		switch {
		case typ == "chunk_start":
			return nil, l.start(f)
		case l.assembling:
			return l.fragment(typ, trimmed, f)
		case typ == "chunk_data" || typ == "chunk_end":
			return nil, nil // outside a chunked message: ignored
		}
		// Any other type is an ordinary message.
	} else if l.assembling {
		return l.countFragment()
	}
	return decodeLangBotMessage(f)
}

// start begins reassembling a chunked message.
func (l *LangBot) start(f lbFrame) error {
	total, ok := jsonInt(f.TotalSize)
	if !ok || total < 0 || total > MaxMessageBytes {
		l.reset()
		return langBotFramingError("chunk_start total_size must be an integer between 0 and %d", MaxMessageBytes)
	}
	l.assembling, l.total, l.fragments, l.buf = true, int(total), 0, l.buf[:0]
	return nil
}

// countFragment counts a line read during reassembly that carries nothing.
func (l *LangBot) countFragment() (*Request, error) {
	l.fragments++
	if l.fragments > langBotMaxFragments {
		l.reset()
		return nil, langBotFramingError("chunked message exceeds %d fragments", langBotMaxFragments)
	}
	return nil, nil
}

// fragment handles a chunk line while a chunked message is open.
func (l *LangBot) fragment(typ string, line []byte, f lbFrame) (*Request, error) {
	if _, err := l.countFragment(); err != nil {
		return nil, err
	}
	switch typ {
	case "chunk_data":
		var piece struct {
			Data *string `json:"data"`
		}
		_ = json.Unmarshal(line, &piece)
		offset, ok := jsonInt(f.Offset)
		switch {
		case piece.Data == nil:
			l.reset()
			return nil, langBotFramingError("chunk_data data must be a string")
		case !ok || offset != int64(len(l.buf)):
			got := len(l.buf)
			l.reset()
			return nil, langBotFramingError("chunk_data offset must be %d, the bytes received so far", got)
		case len(l.buf)+len(*piece.Data) > l.total:
			l.reset()
			return nil, langBotFramingError("chunked message exceeds its total_size")
		}
		l.buf = append(l.buf, *piece.Data...)
		return nil, nil
	case "chunk_end":
		msg := l.buf
		complete := len(msg) == l.total
		l.assembling = false
		l.buf = l.buf[:0]
		if cap(l.buf) > 1<<20 {
			l.buf = nil // keep a huge buffer no longer than it is needed
		}
		if !complete {
			return nil, langBotFramingError("chunked message ended after %d of %d bytes", len(msg), l.total)
		}
		return l.decodeWhole(msg)
	}
	return nil, nil // other types are ignored while reassembling
}

// decodeWhole decodes a reassembled message; it cannot be chunked again.
func (l *LangBot) decodeWhole(msg []byte) (*Request, error) {
	trimmed := bytes.TrimSpace(msg)
	var f lbFrame
	if len(trimmed) == 0 || trimmed[0] != '{' || !utf8.Valid(trimmed) || json.Unmarshal(trimmed, &f) != nil {
		return nil, nil
	}
	return decodeLangBotMessage(f)
}

func (l *LangBot) reset() {
	l.assembling, l.total, l.fragments, l.buf = false, 0, 0, l.buf[:0]
}

// langBotFramingError reports a broken chunked message. The reference
// closes the connection; boxrt drops the message and answers seq_id -1
// (which no caller waits for), so one bad sender does not cost the host
// every action in flight.
func langBotFramingError(format string, args ...any) error {
	return &DecodeError{ID: langBotNoID, Err: langBotValidation(format, args...)}
}

func langBotValidation(format string, args ...any) *Error {
	return &Error{Code: boxerr.ErrInvalidRequest.Code, Type: "ValidationError", Message: fmt.Sprintf(format, args...)}
}

// decodeLangBotMessage turns a decoded object into a request. The raw
// members are copies (json.RawMessage copies on decode), so the request
// outlives the frame.
func decodeLangBotMessage(f lbFrame) (*Request, error) {
	if f.Code != nil || f.Action == nil {
		return nil, nil // a response, or nothing the protocol knows
	}
	id := langBotNoID
	if f.SeqID != nil && string(f.SeqID) != "null" {
		id = f.SeqID
	}
	refuse := func(format string, args ...any) error {
		return &DecodeError{ID: id, Err: langBotValidation(format, args...)}
	}
	if _, ok := jsonInt(f.SeqID); !ok {
		return nil, refuse("seq_id: Input should be a valid integer")
	}
	action, ok := jsonString(f.Action)
	if !ok {
		return nil, refuse("action: Input should be a valid string")
	}
	if f.Data == nil || f.Data[0] != '{' {
		return nil, refuse("data: Input should be a valid dictionary")
	}
	meta, err := decodeLangBotContext(f.Context)
	if err != nil {
		return nil, refuse("context: %v", err)
	}
	return &Request{Method: action, Params: f.Data, ID: f.SeqID, Meta: meta}, nil
}

// decodeLangBotContext validates the envelope's context as the reference's
// ActionContext (or InstallationBinding, of which the Box uses the same
// three members): unknown members are refused, ids must be non-empty once
// trimmed, the generation a positive integer (1 when absent).
func decodeLangBotContext(raw json.RawMessage) (*Meta, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] != '{' {
		return nil, fmt.Errorf("must be an object")
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return nil, err
	}
	m := &Meta{PlacementGeneration: 1}
	for k, v := range members {
		switch k {
		case "instance_uuid", "workspace_uuid":
			s, ok := jsonString(v)
			if s = strings.TrimSpace(s); !ok || s == "" {
				return nil, fmt.Errorf("%s: must be a non-empty string", k)
			}
			if k == "instance_uuid" {
				m.InstanceUUID = s
			} else {
				m.WorkspaceUUID = s
			}
		case "placement_generation":
			n, ok := jsonInt(v)
			if !ok || n < 1 {
				return nil, fmt.Errorf("placement_generation: must be an integer >= 1")
			}
			m.PlacementGeneration = n
		case "installation_uuid", "runtime_revision", "artifact_digest":
			// An installation binding's members; the Box does not use them.
		default:
			return nil, fmt.Errorf("%s: Extra inputs are not permitted", k)
		}
	}
	if m.InstanceUUID == "" || m.WorkspaceUUID == "" {
		return nil, fmt.Errorf("instance_uuid and workspace_uuid are required")
	}
	return m, nil
}

func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

// jsonInt reads a JSON integer (no fraction, no exponent, no string).
func jsonInt(raw json.RawMessage) (int64, bool) {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

// Encode writes m as one envelope answer; on stdio one longer than
// LangBotChunkBytes becomes chunk lines. Notifications have no place in
// the envelope and are dropped.
func (l *LangBot) Encode(frames [][]byte, m Message) ([][]byte, error) {
	if m.Method != "" {
		return frames, nil
	}
	msg := encodeLangBotAnswer(&m)
	if len(msg) > MaxMessageBytes {
		msg = encodeLangBotAnswer(&Message{ID: m.ID, Error: &Error{Type: "ValueError",
			Message: fmt.Sprintf("Runtime message exceeds %d byte limit", MaxMessageBytes)}})
	}
	if !l.stdio || len(msg) <= LangBotChunkBytes {
		return append(frames, msg), nil
	}
	return chunkLines(frames, msg), nil
}

func encodeLangBotAnswer(m *Message) []byte {
	id := m.ID
	if len(id) == 0 || string(id) == "null" {
		id = langBotNoID
	}
	code, message, data := "0", "success", m.Result
	if m.Error != nil {
		code, message, data = "1", LangBotMessage(m.Error), langBotErrorData(m.Error)
	} else if len(data) == 0 {
		data = emptyResult
	}
	b := make([]byte, 0, 80+len(id)+len(message)+len(data))
	b = append(b, `{"seq_id":`...)
	b = append(b, id...)
	b = append(b, `,"code":`...)
	b = append(b, code...)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, message)
	b = append(b, `,"data":`...)
	b = append(b, data...)
	return append(b, `,"chunk_status":"continue"}`...)
}

// langBotErrorData is an error answer's data: {} as the reference sends,
// or {"retry_after_ms": n} for a refusal that says when to retry.
func langBotErrorData(e *Error) json.RawMessage {
	ms, ok := e.Details["retry_after_ms"].(int64)
	if !ok {
		return emptyResult
	}
	return append(strconv.AppendInt([]byte(`{"retry_after_ms":`), ms, 10), '}')
}

// LangBotMessage is the envelope's error message for e: "<Class>: <text>",
// with the classes the host's substring table expects. boxrt's own kinds
// already carry the reference's class names; the protocol kinds become the
// Python classes the reference raises.
func LangBotMessage(e *Error) string {
	class, text := e.Type, strings.ToValidUTF8(e.Message, "\uFFFD")
	switch e.Type {
	case boxerr.ErrParse.Type, boxerr.ErrInvalidRequest.Type:
		class = "ValidationError"
	case boxerr.ErrMethodNotFound.Type:
		class = "ValueError"
		if name, ok := e.Details["method"].(string); ok {
			text = "Action " + name + " not found"
		}
	case boxerr.ErrInternal.Type:
		class = "RuntimeError"
	}
	if utf8.RuneCountInString(text) > langBotMaxErrorChars {
		r := []rune(text)
		text = string(r[:langBotMaxErrorChars]) + langBotTruncated
	}
	return class + ": " + text
}

// chunkLines appends to frames the chunk control lines of msg, each piece
// at most LangBotChunkBytes and never splitting a code point; offset
// counts the bytes of the pieces before.
func chunkLines(frames [][]byte, msg []byte) [][]byte {
	frames = slices.Grow(frames, 2+len(msg)/LangBotChunkBytes+1)
	frames = append(frames, []byte(`{"type":"chunk_start","total_size":`+strconv.Itoa(len(msg))+`}`))
	for off := 0; off < len(msg); {
		end := min(off+LangBotChunkBytes, len(msg))
		for end < len(msg) && end > off && !utf8.RuneStart(msg[end]) {
			end--
		}
		line := make([]byte, 0, 2*(end-off)+64)
		line = append(line, `{"type":"chunk_data","data":`...)
		line = appendJSONString(line, string(msg[off:end]))
		line = append(line, `,"offset":`...)
		line = strconv.AppendInt(line, int64(off), 10)
		frames = append(frames, append(line, '}'))
		off = end
	}
	return append(frames, []byte(`{"type":"chunk_end"}`))
}

// appendJSONString appends s as a JSON string escaping only what JSON
// requires: '"', '\\' and control characters. '<', '>' and '&' stay as
// they are (encoding/json would make each 6 bytes), so a piece of n bytes
// is at most 2n bytes once quoted — except control bytes, which the
// message text never holds raw (it is JSON already).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
