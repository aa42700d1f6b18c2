package reconnect

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Sentinels for errors.Is: every row of boxrt's one wire error table
// (internal/boxerr, a leaf package, so a host importing this client pulls in
// nothing else of boxrt; TestSentinelsCoverTheTable holds the two equal).
// Each matches an *Error carrying its code.
var (
	ErrBox                = boxerr.ErrBox
	ErrValidation         = boxerr.ErrValidation
	ErrBackendUnavailable = boxerr.ErrBackendUnavailable
	ErrRuntimeUnavailable = boxerr.ErrRuntimeUnavailable
	ErrSessionConflict    = boxerr.ErrSessionConflict
	ErrSessionNotFound    = boxerr.ErrSessionNotFound
	ErrProcessConflict    = boxerr.ErrProcessConflict
	ErrProcessNotFound    = boxerr.ErrProcessNotFound
	ErrCapacityExceeded   = boxerr.ErrCapacityExceeded
	ErrAdmission          = boxerr.ErrAdmission
	ErrReadiness          = boxerr.ErrReadiness
	ErrPermission         = boxerr.ErrPermission
	ErrFileNotFound       = boxerr.ErrFileNotFound
	ErrSnapshotCorrupted  = boxerr.ErrSnapshotCorrupted
	ErrParse              = boxerr.ErrParse
	ErrInvalidRequest     = boxerr.ErrInvalidRequest
	ErrMethodNotFound     = boxerr.ErrMethodNotFound
	ErrInternal           = boxerr.ErrInternal
)

// ErrClosed is returned by calls made after, or cut short by, Client.Close.
// It is not an *Error: nothing went wrong on the wire, the host gave up.
var ErrClosed = errors.New("reconnect: client closed")

// Error is a JSON-RPC error from boxrt, or one the client reports in the
// same shape (a lost link is a retryable BoxRuntimeUnavailableError, just as
// the server reports a busy connection).
type Error struct {
	// Code is the JSON-RPC error code, e.g. -32004.
	Code int64
	// Type is the boxrt error type, e.g. "BoxSessionNotFoundError", taken
	// from data.type (or derived from Code when the server sent none).
	Type string
	// Message is the wire message verbatim, "<Type>: <text>" for boxrt.
	Message string
	// Retryable reports whether the same call may succeed later unchanged
	// (data.retryable; for a lost link, always true).
	Retryable bool
	// Data is the raw data object: type, retryable and details such as
	// "field" or "limit". Errors made by the client carry
	// {"type","retryable"} only.
	Data json.RawMessage

	cause error // local errors only: why the link was lost, ctx.Err(), …
}

func (e *Error) Error() string {
	if e.Type == "" || strings.HasPrefix(e.Message, e.Type+":") {
		return e.Message
	}
	return e.Type + ": " + e.Message
}

// Is reports whether target is the sentinel for e's code, so that
// errors.Is(err, ErrSessionNotFound) holds for a -32004 from the server.
func (e *Error) Is(target error) bool {
	k, ok := target.(*boxerr.Kind)
	return ok && k.Code == e.Code
}

// Unwrap returns the local cause (context.DeadlineExceeded, the child's
// exit, …) for errors the client produced; nil for server errors.
func (e *Error) Unwrap() error { return e.cause }

// fromWire maps a JSON-RPC error object to an *Error. The type and
// retryable flag come from data when present, so a newer server's types
// (BoxAdmissionError, …) survive even if this table does not know them.
func fromWire(we *jsonrpc2.Error) *Error {
	e := &Error{Code: we.Code, Message: we.Message}
	if k := boxerr.ByCode(we.Code); k != nil {
		e.Type, e.Retryable = k.Type, k.Retryable
	}
	if we.Data != nil {
		e.Data = append(json.RawMessage(nil), *we.Data...)
		var d struct {
			Type      *string `json:"type"`
			Retryable *bool   `json:"retryable"`
		}
		if json.Unmarshal(*we.Data, &d) == nil {
			if d.Type != nil && *d.Type != "" {
				e.Type = *d.Type
			}
			if d.Retryable != nil {
				e.Retryable = *d.Retryable
			}
		}
	}
	if e.Type == "" {
		// A non-boxrt peer: recover the type from a "<Type>: text"
		// message if it looks like one, as LangBot's host does.
		if t, _, ok := strings.Cut(e.Message, ": "); ok && strings.HasPrefix(t, "Box") && !strings.ContainsAny(t, " \t") {
			e.Type = t
		}
	}
	return e
}

// localError builds a client-made *Error of kind k.
func localError(k *boxerr.Kind, retryable bool, cause error, format string, args ...any) *Error {
	data, _ := json.Marshal(map[string]any{"type": k.Type, "retryable": retryable})
	return &Error{
		Code:      k.Code,
		Type:      k.Type,
		Message:   k.Type + ": " + fmt.Sprintf(format, args...),
		Retryable: retryable,
		Data:      data,
		cause:     cause,
	}
}

// unavailable is the error for a call that could not be answered because
// the link was down or went down: retryable, so a host may send it again
// once the link is back.
func unavailable(cause error, format string, args ...any) *Error {
	return localError(ErrRuntimeUnavailable, true, cause, format, args...)
}

// connectError is what Spawn and Dial return when no first link came up:
// always a BoxRuntimeUnavailableError, retryable unless retrying cannot
// help (no such executable, refused token, a hook error that is not
// retryable). The cause stays reachable, so a BoxValidationError from
// box_init in the hook still matches errors.Is(err, ErrValidation).
func connectError(cause error) *Error {
	return localError(ErrRuntimeUnavailable, !isPermanent(cause), cause, "cannot connect to boxrt: %v", cause)
}

// permanentError marks a connection failure that retrying cannot fix (no
// such executable, wrong token): the constructors return it at once
// instead of backing off until their context ends.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

func permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

func isPermanent(err error) bool {
	var p *permanentError
	if errors.As(err, &p) {
		return true
	}
	// A non-retryable answer to the handshake (box_init refusing the
	// config, say) will be refused again.
	var e *Error
	return errors.As(err, &e) && e.cause == nil && !e.Retryable
}
