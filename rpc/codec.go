package rpc

import (
	"encoding/json"
)

// Codec is the envelope of one connection: it turns an inbound frame into
// a Request and an outbound Message into frames. The frame loop decodes
// each frame once and encodes each answer once; everything between (the
// running bound and queue, cancellation, size limits, write coalescing) is the
// loop's and the same for every codec. A codec may keep per-connection
// state (reassembling a message sent in chunks), so the Server makes one
// per connection; the loop calls Decode from one goroutine and Encode from
// many, so Encode must be safe for concurrent use.
type Codec interface {
	// Decode turns one frame into req, which the loop reuses from call to
	// call (every member is overwritten; a Method equal to the previous
	// one may be kept, so a repeated method costs no new string). false
	// with a nil error means there is nothing to do (a response from the
	// peer, one chunk of a message still incomplete). A malformed frame is
	// a *DecodeError, answered with its error to its id. The frame is
	// reused after the next read, so the request must not reference it,
	// except from this package's codecs, which mark such a request
	// (Request.inFrame) and which the loop copies before its handler can
	// outlive that read.
	Decode(frame []byte, req *Request) (bool, error)
	// Encode appends the frames that carry m to frames, in order: one for
	// JSON-RPC, several for an envelope that splits large messages. The
	// frames are the caller's; the codec keeps no reference, and each
	// frame's array is its own, shared with no other frame or value (a
	// transport may append to a frame in its spare capacity).
	Encode(frames [][]byte, m Message) ([][]byte, error)
}

// Message is what the server sends: the answer to a request (Result or
// Error, with the request's ID) or a notification (Method, Params).
type Message struct {
	// ID is the request's ID as the codec decoded it; nil when it could not
	// be read (the codec encodes its "no id", JSON-RPC's null).
	ID     json.RawMessage
	Result json.RawMessage
	Error  *Error

	Method string
	Params json.RawMessage
}

// DecodeError is a frame the codec refused, with the id to answer to (nil
// when it could not be read).
type DecodeError struct {
	ID  json.RawMessage
	Err *Error
}

func (e *DecodeError) Error() string { return e.Err.Error() }

// Meta is the tenant context a request carries: JSON-RPC's "meta" member,
// the LangBot envelope's "context". The rpc layer only carries it
// (Request.Meta, MetaFrom); the handler decides what it means (boxrt's
// tenancy layer namespaces and fences by it).
type Meta struct {
	InstanceUUID        string `json:"instance_uuid"`
	WorkspaceUUID       string `json:"workspace_uuid"`
	PlacementGeneration int64  `json:"placement_generation"`
}
