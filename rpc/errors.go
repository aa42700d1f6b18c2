package rpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Error is a wire error before encoding. Message is the bare text; the wire
// message becomes "<Type>: <Message>" so hosts that match on the type name
// as a substring keep working.
type Error struct {
	Code      int64
	Type      string
	Message   string
	Retryable bool
	Details   map[string]any
}

func (e *Error) Error() string { return e.Type + ": " + e.Message }

// jsonrpc encodes e as a JSON-RPC error object.
func (e *Error) jsonrpc() *jsonrpc2.Error {
	data := make(map[string]any, len(e.Details)+2)
	for k, v := range e.Details {
		data[k] = v
	}
	data["type"] = e.Type
	data["retryable"] = e.Retryable
	raw, err := json.Marshal(data)
	if err != nil {
		raw = []byte(fmt.Sprintf(`{"type":%q,"retryable":%t}`, e.Type, e.Retryable))
	}
	msg := json.RawMessage(raw)
	return &jsonrpc2.Error{Code: e.Code, Message: e.Error(), Data: &msg}
}

// ErrorEncoder turns an error returned by a Handler into a wire Error.
type ErrorEncoder func(error) *Error

// Sentinels the transport itself produces; the ErrorEncoder sees
// ErrResponseTooLarge so it can give it the application's error type.
var (
	// ErrResponseTooLarge: an encoded response exceeded the message limit.
	ErrResponseTooLarge = errors.New("response exceeds the message size limit")
	// ErrNoReply: a Handler returns it for a request that must get no
	// answer at all (LangBot's cancelled actions of a retired generation).
	ErrNoReply = errors.New("request gets no reply")
)

// MethodNotFoundError is returned by a Handler for a name it does not serve.
type MethodNotFoundError struct{ Method string }

func (e *MethodNotFoundError) Error() string { return fmt.Sprintf("method %q not found", e.Method) }

func protocolError(k *boxerr.Kind, format string, args ...any) *Error {
	return &Error{Code: k.Code, Type: k.Type, Retryable: k.Retryable, Message: fmt.Sprintf(format, args...)}
}

// QueueFullLimit is the limit a queue-full refusal names.
const QueueFullLimit = "max_queued_requests"

// queueFull refuses a request the connection's queue has no room for;
// retry_after_ms says when the requests ahead should be done.
func queueFull(limit int, retryAfter time.Duration) *Error {
	ms := retryAfter.Milliseconds()
	return protocolError(boxerr.ErrCapacityExceeded,
		"Runtime connection queue is full (at most %d requests wait on one connection); retry after %d ms", limit, ms).
		withDetail("limit", QueueFullLimit).withDetail("value", limit).withDetail("retry_after_ms", ms)
}

func parseError(format string, args ...any) *Error {
	return protocolError(boxerr.ErrParse, format, args...)
}

func invalidRequest(format string, args ...any) *Error {
	return protocolError(boxerr.ErrInvalidRequest, format, args...)
}

// Encode applies the standard mappings the transport owns (method not
// found, an *Error as is), then enc.
func Encode(enc ErrorEncoder, err error) *Error {
	var nf *MethodNotFoundError
	var we *Error
	switch {
	case errors.As(err, &nf):
		return protocolError(boxerr.ErrMethodNotFound, "%s", nf.Error()).withDetail("method", nf.Method)
	case errors.As(err, &we):
		return we
	case enc != nil:
		if e := enc(err); e != nil {
			return e
		}
	}
	return protocolError(boxerr.ErrInternal, "%s", err.Error())
}

func (e *Error) withDetail(k string, v any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[k] = v
	return e
}
