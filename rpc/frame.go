package rpc

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// MaxMessageBytes is the largest JSON-RPC message either transport accepts
// or sends.
const MaxMessageBytes = 16 << 20

// envelope is a JSON-RPC 2.0 request as it arrives, before id remapping.
type envelope struct {
	JSONRPC *string         `json:"jsonrpc"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
	ID      json.RawMessage `json:"id"`
	Meta    json.RawMessage `json:"meta"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

// frameKind says what a decoded frame is.
type frameKind int

const (
	frameRequest frameKind = iota
	frameNotification
	frameResponse // a response from the peer; servers ignore it
)

// decoded is a valid request or notification. ID is the caller's id exactly
// as sent (string, number or null) so it can be echoed back verbatim.
type decoded struct {
	kind   frameKind
	method string
	params json.RawMessage
	meta   json.RawMessage
	id     json.RawMessage
}

var nullID = json.RawMessage("null")

// decodeFrame validates one frame. On failure it returns the error to send
// back and the id to send it with (null when the id could not be read); a nil
// *Error with a nil result means "ignore silently".
func decodeFrame(frame []byte) (*decoded, json.RawMessage, *Error) {
	trimmed := bytes.TrimSpace(frame)
	if len(trimmed) == 0 {
		return nil, nil, nil
	}
	if !utf8.Valid(trimmed) {
		return nil, nullID, parseError("message is not valid UTF-8")
	}
	switch trimmed[0] {
	case '[':
		if !json.Valid(trimmed) {
			return nil, nullID, parseError("message is not valid JSON")
		}
		return nil, nullID, invalidRequest("batch requests are not supported; send one request per message")
	case '{':
	default:
		if !json.Valid(trimmed) {
			return nil, nullID, parseError("message is not valid JSON")
		}
		return nil, nullID, invalidRequest("a request must be a JSON object")
	}
	var env envelope
	if err := json.Unmarshal(trimmed, &env); err != nil {
		if !json.Valid(trimmed) {
			return nil, nullID, parseError("message is not valid JSON: %v", err)
		}
		// Valid JSON whose members have the wrong types.
		return nil, idOrNull(trimmed), invalidRequest("malformed request: %v", err)
	}
	id := nullID
	hasID := env.ID != nil
	if hasID {
		id = env.ID
		if !validID(id) {
			return nil, nullID, invalidRequest("id must be a string, a number or null")
		}
	}
	if env.Method == nil && (env.Result != nil || env.Error != nil) {
		return &decoded{kind: frameResponse, id: id}, nil, nil
	}
	if env.JSONRPC == nil || *env.JSONRPC != "2.0" {
		return nil, id, invalidRequest(`"jsonrpc" must be exactly "2.0"`)
	}
	if env.Method == nil || *env.Method == "" {
		return nil, id, invalidRequest(`"method" must be a non-empty string`)
	}
	if p := bytes.TrimSpace(env.Params); len(p) > 0 && p[0] != '{' && p[0] != '[' {
		return nil, id, invalidRequest(`"params" must be an object or an array`)
	}
	d := &decoded{kind: frameRequest, method: *env.Method, params: env.Params, meta: env.Meta, id: id}
	if !hasID {
		d.kind = frameNotification
	}
	return d, nil, nil
}

func validID(id json.RawMessage) bool {
	t := bytes.TrimSpace(id)
	if len(t) == 0 {
		return false
	}
	switch t[0] {
	case '"':
		return true
	case 'n':
		return string(t) == "null"
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return true
	}
	return false
}

// idOrNull digs the id out of a request whose other members are malformed,
// so the error can still be correlated.
func idOrNull(frame []byte) json.RawMessage {
	var probe struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(frame, &probe) == nil && probe.ID != nil && validID(probe.ID) {
		return probe.ID
	}
	return nullID
}
