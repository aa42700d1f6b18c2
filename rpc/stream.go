package rpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

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

type internalRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      *uint64         `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
	Meta    json.RawMessage `json:"meta,omitempty"`
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
		req := internalRequest{JSONRPC: "2.0", Method: d.method, Params: d.params, Meta: d.meta}
		if d.kind == frameRequest {
			id := s.remember(d.id)
			req.ID = &id
		}
		raw, err := json.Marshal(req)
		if err != nil {
			s.writeError(d.id, invalidRequest("cannot re-encode request: %v", err))
			continue
		}
		return json.Unmarshal(raw, v)
	}
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
