package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/sourcegraph/jsonrpc2"
)

// frameConn moves whole messages. ReadFrame returns errFrameTooLarge (after
// discarding the oversized message) when the connection can go on.
type frameConn interface {
	ReadFrame() ([]byte, error)
	WriteFrame([]byte) error
	Close() error
}

var errFrameTooLarge = errors.New("message exceeds the size limit")

// serverStream adapts a frameConn to jsonrpc2.ObjectStream for the serving
// side. It answers malformed frames itself, so that jsonrpc2 — which closes
// the connection on any read error — only ever sees valid requests, and it
// remaps request ids: jsonrpc2 only handles unsigned integer ids, while
// JSON-RPC 2.0 allows strings, any number and null. Each request gets an
// internal id and the caller's original id is written back verbatim.
type serverStream struct {
	fc      frameConn
	log     zerolog.Logger
	encoder ErrorEncoder

	wmu sync.Mutex // serialises writes from jsonrpc2 and from ReadObject

	mu   sync.Mutex
	next uint64
	ids  map[uint64]json.RawMessage
}

func newServerStream(fc frameConn, log zerolog.Logger, enc ErrorEncoder) *serverStream {
	return &serverStream{fc: fc, log: log, encoder: enc, ids: map[uint64]json.RawMessage{}}
}

// ReadObject implements jsonrpc2.ObjectStream.
func (s *serverStream) ReadObject(v any) error {
	for {
		frame, err := s.fc.ReadFrame()
		if errors.Is(err, errFrameTooLarge) {
			s.log.Warn().Int("limit", MaxMessageBytes).Msg("refused oversized message")
			s.writeError(nullID, invalidRequest("message exceeds the %d-byte limit", MaxMessageBytes))
			continue
		}
		if err != nil {
			// The peer stopped sending (stdin EOF): answer what is already
			// in flight before jsonrpc2 closes the connection.
			s.drain(drainTimeout)
			return err
		}
		d, errID, perr := decodeFrame(frame)
		if perr != nil {
			s.log.Debug().Str("error_type", perr.Type).Str("error", perr.Message).Msg("rejected malformed message")
			s.writeError(errID, perr)
			continue
		}
		if d == nil || d.kind == frameResponse {
			continue
		}
		var id *uint64
		if d.kind == frameRequest {
			n := s.remember(d.id)
			id = &n
		}
		return json.Unmarshal(internalRequest(id, d), v)
	}
}

// drainTimeout bounds how long a connection whose peer stopped sending
// waits for the answers still owed.
const drainTimeout = 3 * time.Second

// drain waits until every request read so far has been answered, or
// timeout.
func (s *serverStream) drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		pending := len(s.ids)
		s.mu.Unlock()
		if pending == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// internalRequest encodes d for jsonrpc2 with the internal id. The parts
// were validated by decodeFrame, so they are spliced in as they are rather
// than re-encoded.
func internalRequest(id *uint64, d *decoded) []byte {
	method, _ := json.Marshal(d.method)
	b := make([]byte, 0, 64+len(method)+len(d.params)+len(d.meta))
	b = append(b, `{"jsonrpc":"2.0"`...)
	if id != nil {
		b = append(b, `,"id":`...)
		b = strconv.AppendUint(b, *id, 10)
	}
	b = append(b, `,"method":`...)
	b = append(b, method...)
	if len(d.params) > 0 {
		b = append(b, `,"params":`...)
		b = append(b, d.params...)
	}
	if len(d.meta) > 0 {
		b = append(b, `,"meta":`...)
		b = append(b, d.meta...)
	}
	return append(b, '}')
}

func (s *serverStream) remember(original json.RawMessage) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.ids[s.next] = append(json.RawMessage(nil), original...)
	return s.next
}

func (s *serverStream) forget(internal uint64) json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ids[internal]
	if !ok {
		return nullID
	}
	delete(s.ids, internal)
	return id
}

type wireResponse struct {
	JSONRPC string           `json:"jsonrpc"`
	ID      json.RawMessage  `json:"id"`
	Result  *json.RawMessage `json:"result,omitempty"`
	Error   *jsonrpc2.Error  `json:"error,omitempty"`
}

// WriteObject implements jsonrpc2.ObjectStream. jsonrpc2 hands over an
// unexported message wrapper, so the response is re-read from its encoding
// to put the caller's original id back.
func (s *serverStream) WriteObject(obj any) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if out, ok := s.rewriteResponse(raw); ok {
		return s.writeFrame(out)
	}
	var resp struct {
		ID     *uint64          `json:"id"`
		Method *string          `json:"method"`
		Result *json.RawMessage `json:"result"`
		Error  *jsonrpc2.Error  `json:"error"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil || resp.Method != nil || resp.ID == nil {
		return s.writeFrame(raw)
	}
	out := wireResponse{JSONRPC: "2.0", ID: s.forget(*resp.ID), Result: resp.Result, Error: resp.Error}
	if out.Result == nil && out.Error == nil {
		null := json.RawMessage("null")
		out.Result = &null
	}
	if raw, err = json.Marshal(out); err != nil {
		return err
	}
	if len(raw) > MaxMessageBytes {
		s.log.Error().Int("bytes", len(raw)).Msg("response exceeds the message limit; sending an error instead")
		e := Encode(s.encoder, fmt.Errorf("%w (%d bytes, limit %d)", ErrResponseTooLarge, len(raw), MaxMessageBytes))
		if raw, err = json.Marshal(wireResponse{JSONRPC: "2.0", ID: out.ID, Error: e.jsonrpc()}); err != nil {
			return err
		}
	}
	return s.writeFrame(raw)
}

// rewriteResponse puts the caller's id into a response as jsonrpc2 encodes
// it — {"id":N,<result or error>,"jsonrpc":"2.0"} — without decoding it
// again. It declines anything else (and oversized responses), leaving
// them to the general path.
func (s *serverStream) rewriteResponse(raw []byte) ([]byte, bool) {
	const head, tail = `{"id":`, `,"jsonrpc":"2.0"}`
	if len(raw) > MaxMessageBytes || !bytes.HasPrefix(raw, []byte(head)) || !bytes.HasSuffix(raw, []byte(tail)) {
		return nil, false
	}
	i := len(head)
	j := i
	for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
		j++
	}
	if j == i || j >= len(raw) || raw[j] != ',' {
		return nil, false
	}
	n, err := strconv.ParseUint(string(raw[i:j]), 10, 64)
	if err != nil {
		return nil, false
	}
	body := raw[j+1 : len(raw)-len(tail)]
	if !bytes.HasPrefix(body, []byte(`"result":`)) && !bytes.HasPrefix(body, []byte(`"error":`)) {
		return nil, false
	}
	id := s.forget(n)
	out := make([]byte, 0, len(raw)+len(id)+8)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, id...)
	out = append(out, ',')
	out = append(out, body...)
	return append(out, '}'), true
}

func (s *serverStream) writeError(id json.RawMessage, e *Error) {
	if err := s.writeJSON(wireResponse{JSONRPC: "2.0", ID: id, Error: e.jsonrpc()}); err != nil {
		s.log.Debug().Err(err).Msg("cannot write error response")
	}
}

func (s *serverStream) writeJSON(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.writeFrame(raw)
}

func (s *serverStream) writeFrame(raw []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.fc.WriteFrame(raw)
}

// Close implements jsonrpc2.ObjectStream.
func (s *serverStream) Close() error { return s.fc.Close() }
