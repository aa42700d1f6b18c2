package rpc

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// MaxMessageBytes is the largest message either transport accepts or
// sends.
const MaxMessageBytes = 16 << 20

// JSONRPC is the JSON-RPC 2.0 codec: one request object per frame (batches
// are refused), ids of any JSON-RPC type echoed back byte for byte, and the
// "meta" member as the tenant context. It is stateless, so one value
// serves every connection.
type JSONRPC struct{}

// envelope is a JSON-RPC 2.0 request as it arrives.
type envelope struct {
	JSONRPC *string         `json:"jsonrpc"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
	ID      json.RawMessage `json:"id"`
	Meta    json.RawMessage `json:"meta"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

var nullID = json.RawMessage("null")

// Decode validates one frame and decodes it in a single pass. The id is
// kept as raw JSON — a string, any number, or null — because
// jsonrpc2.ID holds only strings and unsigned integers, and the answer
// must carry the id exactly as sent.
func (JSONRPC) Decode(frame []byte, req *Request) (bool, error) {
	trimmed := bytes.TrimSpace(frame)
	if len(trimmed) == 0 {
		return false, nil
	}
	if !utf8.Valid(trimmed) {
		return false, refuse(nil, parseError("message is not valid UTF-8"))
	}
	switch trimmed[0] {
	case '[':
		if !json.Valid(trimmed) {
			return false, refuse(nil, parseError("message is not valid JSON"))
		}
		return false, refuse(nil, invalidRequest("batch requests are not supported; send one request per message"))
	case '{':
	default:
		if !json.Valid(trimmed) {
			return false, refuse(nil, parseError("message is not valid JSON"))
		}
		return false, refuse(nil, invalidRequest("a request must be a JSON object"))
	}
	if decodeFast(trimmed, req) {
		return true, nil
	}
	return decodeGeneral(trimmed, req)
}

// decodeGeneral decodes a request object with encoding/json and words
// every refusal.
func decodeGeneral(trimmed []byte, req *Request) (bool, error) {
	var env envelope
	if err := json.Unmarshal(trimmed, &env); err != nil {
		if !json.Valid(trimmed) {
			return false, refuse(nil, parseError("message is not valid JSON: %v", err))
		}
		// Valid JSON whose members have the wrong types.
		return false, refuse(idOf(trimmed), invalidRequest("malformed request: %v", err))
	}
	var id json.RawMessage
	if env.ID != nil {
		if !validID(env.ID) {
			return false, refuse(nil, invalidRequest("id must be a string, a number or null"))
		}
		id = env.ID
	}
	if env.Method == nil && (env.Result != nil || env.Error != nil) {
		return false, nil // a response from the peer: the server sends no requests
	}
	if env.JSONRPC == nil || *env.JSONRPC != "2.0" {
		return false, refuse(id, invalidRequest(`"jsonrpc" must be exactly "2.0"`))
	}
	if env.Method == nil || *env.Method == "" {
		return false, refuse(id, invalidRequest(`"method" must be a non-empty string`))
	}
	if p := bytes.TrimSpace(env.Params); len(p) > 0 && p[0] != '{' && p[0] != '[' {
		return false, refuse(id, invalidRequest(`"params" must be an object or an array`))
	}
	*req = Request{Method: *env.Method, Params: env.Params, ID: id, Notif: id == nil, Meta: decodeMeta(env.Meta)}
	return true, nil
}

// decodeFast reads a well-formed request in one pass without reflection:
// the members are found by a scan that validates as it goes, and kept as
// raw JSON that references b (see Codec.Decode). It only accepts;
// anything it is not sure of — invalid JSON, a response, a member name
// with escapes or in other case (encoding/json matches names
// case-insensitively), a duplicate, a member of the wrong type, a request
// that fails validation — is left to the general path, which decides and
// words the error. The fuzz test holds the two paths to the same answer.
// b is trimmed, valid UTF-8 and starts with '{'. req is written only
// when it accepts.
func decodeFast(b []byte, req *Request) bool {
	var jsonrpc, method, id, params, meta []byte
	i := skipSpace(b, 1)
	if i >= len(b) || b[i] == '}' {
		return false
	}
	for {
		end, ok := scanString(b, i)
		if !ok {
			return false
		}
		key := b[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		if end, ok = scanValue(b, i); !ok {
			return false
		}
		val := b[i:end]
		var dst *[]byte
		switch string(key) {
		case "jsonrpc":
			dst = &jsonrpc
		case "method":
			dst = &method
		case "id":
			dst = &id
		case "params":
			dst = &params
		case "meta":
			dst = &meta
		default:
			for _, known := range [...]string{"jsonrpc", "method", "id", "params", "meta", "result", "error"} {
				if bytes.EqualFold(key, []byte(known)) {
					return false
				}
			}
		}
		if dst != nil {
			if *dst != nil {
				return false
			}
			*dst = val
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return false
		}
		if b[i] == '}' {
			if i != len(b)-1 {
				return false
			}
			break
		}
		if b[i] != ',' {
			return false
		}
		i = skipSpace(b, i+1)
	}
	if string(jsonrpc) != `"2.0"` || len(method) < 3 || method[0] != '"' || bytes.IndexByte(method, '\\') >= 0 ||
		(id != nil && !validID(id)) || (params != nil && params[0] != '{' && params[0] != '[') {
		return false
	}
	name := req.Method
	if string(method[1:len(method)-1]) != name { // a heartbeat repeats its method: no new string
		name = string(method[1 : len(method)-1])
	}
	*req = Request{Method: name, ID: id, Params: params, Notif: id == nil, Meta: decodeMeta(meta), inFrame: true}
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanValue returns the index after the JSON value starting at b[i], and
// whether it is one. Objects and arrays are delimited by a scan and then
// checked by encoding/json; a request's are small ({} for most).
func scanValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; {
	case c == '"':
		return scanString(b, i)
	case c == '{' || c == '[':
		end, ok := scanComposite(b, i)
		return end, ok && json.Valid(b[i:end])
	case c == 't':
		return scanLiteral(b, i, "true")
	case c == 'f':
		return scanLiteral(b, i, "false")
	case c == 'n':
		return scanLiteral(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return scanNumber(b, i)
	}
	return 0, false
}

// scanString returns the index after the string starting at b[i], and
// whether it is a valid JSON string (escapes, no control characters).
func scanString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			i++
			if i >= len(b) {
				return 0, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return 0, false
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return 0, false
					}
				}
				i += 4
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// scanComposite returns the index after the object or array starting at
// b[i], by bracket depth alone (strings skipped); whether what lies between
// is valid JSON is not checked.
func scanComposite(b []byte, i int) (int, bool) {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			end, ok := scanString(b, i)
			if !ok {
				return 0, false
			}
			i = end
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1, true
			}
		}
		i++
	}
	return 0, false
}

func scanLiteral(b []byte, i int, lit string) (int, bool) {
	end := i + len(lit)
	return end, end <= len(b) && string(b[i:end]) == lit
}

// scanNumber returns the index after the number starting at b[i], and
// whether it has JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i)
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

// decodeMeta reads the tenant context. It is reserved and ignored today,
// so one that does not have the expected shape is dropped rather than
// refused, as before tenancy existed.
func decodeMeta(raw json.RawMessage) *Meta {
	if len(raw) == 0 || raw[0] != '{' {
		return nil
	}
	var m Meta
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return &m
}

func refuse(id json.RawMessage, e *Error) *DecodeError { return &DecodeError{ID: id, Err: e} }

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

// idOf digs the id out of a request whose other members are malformed, so
// the error can still be correlated.
func idOf(frame []byte) json.RawMessage {
	var probe struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(frame, &probe) == nil && probe.ID != nil && validID(probe.ID) {
		return probe.ID
	}
	return nil
}

// Encode writes m as one JSON-RPC object. The result and the id are
// already JSON, so they are spliced in rather than encoded again.
func (JSONRPC) Encode(frames [][]byte, m Message) ([][]byte, error) {
	var b []byte
	switch {
	case m.Method != "":
		method, err := json.Marshal(m.Method)
		if err != nil {
			return frames, err
		}
		// 40: the envelope, the closing brace and room for stdio's
		// newline (lineConn writes a long frame with it in place).
		b = newFrame(40 + len(method) + len(m.Params))
		b = append(b, `{"jsonrpc":"2.0","method":`...)
		b = append(b, method...)
		if len(m.Params) > 0 {
			b = append(b, `,"params":`...)
			b = append(b, m.Params...)
		}
	case m.Error != nil:
		e, err := json.Marshal(m.Error.jsonrpc())
		if err != nil {
			return frames, err
		}
		b = appendHead(newFrame(40+len(m.ID)+len(e)), m.ID)
		b = append(b, `,"error":`...)
		b = append(b, e...)
	default:
		result := m.Result
		if len(result) == 0 {
			result = emptyResult
		}
		b = appendHead(newFrame(40+len(m.ID)+len(result)), m.ID)
		b = append(b, `,"result":`...)
		b = append(b, result...)
	}
	return append(frames, append(b, '}')), nil
}

// recycle implements frameRecycler: every frame Encode returns is a new
// buffer.
func (JSONRPC) recycle(frame []byte) { recycleFrame(frame) }

var emptyResult = json.RawMessage("{}")

func appendHead(b []byte, id json.RawMessage) []byte {
	if id == nil {
		id = nullID
	}
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	return append(b, id...)
}
