package backends

import (
	"errors"
	"fmt"
)

// Error kinds. Each is a sentinel that errors.Is matches against any *Error
// of that kind; the wire layer maps them to JSON-RPC codes and type names.
var (
	ErrBox                = errors.New("BoxError")
	ErrValidation         = errors.New("BoxValidationError")
	ErrBackendUnavailable = errors.New("BoxBackendUnavailableError")
	ErrRuntimeUnavailable = errors.New("BoxRuntimeUnavailableError")
	ErrSessionConflict    = errors.New("BoxSessionConflictError")
	ErrSessionNotFound    = errors.New("BoxSessionNotFoundError")
	ErrProcessConflict    = errors.New("BoxManagedProcessConflictError")
	ErrProcessNotFound    = errors.New("BoxManagedProcessNotFoundError")
	ErrCapacityExceeded   = errors.New("BoxCapacityExceededError")
)

// Error is a typed failure. Kind is one of the sentinels above; Details are
// extra machine-readable facts (field, limit, …) carried in the wire error's
// data object. Details must never hold secrets.
type Error struct {
	Kind      error
	Msg       string
	Retryable bool
	Details   map[string]any
	Err       error
}

func (e *Error) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrValidation) true for a validation *Error.
func (e *Error) Is(target error) bool { return target == e.Kind }

func (e *Error) Unwrap() error { return e.Err }

// Type is the wire type name of the error, e.g. "BoxValidationError".
func (e *Error) Type() string { return e.Kind.Error() }

func newError(kind error, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// With returns e with one more detail set.
func (e *Error) With(key string, value any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[key] = value
	return e
}

// Wrap attaches a cause, kept for errors.Is/As but not shown on the wire
// beyond what Msg says.
func (e *Error) Wrap(cause error) *Error {
	e.Err = cause
	return e
}

// Validation reports a bad parameter. field names it in the wire data.
func Validation(field, format string, args ...any) *Error {
	e := newError(ErrValidation, format, args...)
	if field != "" {
		e.With("field", field)
	}
	return e
}

// Failure is a generic backend or runtime failure (BoxError).
func Failure(format string, args ...any) *Error { return newError(ErrBox, format, args...) }

// BackendUnavailable reports that no usable backend is selected.
func BackendUnavailable(format string, args ...any) *Error {
	return newError(ErrBackendUnavailable, format, args...)
}

// RuntimeUnavailable reports a transient refusal (shutting down, busy); the
// caller may retry.
func RuntimeUnavailable(format string, args ...any) *Error {
	e := newError(ErrRuntimeUnavailable, format, args...)
	e.Retryable = true
	return e
}

// SessionNotFound reports an unknown session id.
func SessionNotFound(sessionID string) *Error {
	return newError(ErrSessionNotFound, "session %s not found", sessionID).With("session_id", sessionID)
}

// SessionConflict reports an existing session whose spec differs in field.
func SessionConflict(sessionID, field string, existing, requested any) *Error {
	return newError(ErrSessionConflict, "Box session %s already exists with %s=%v (requested %v)",
		sessionID, field, existing, requested).
		With("session_id", sessionID).With("field", field).
		With("existing", existing).With("requested", requested)
}

// ProcessNotFound reports an unknown managed process.
func ProcessNotFound(sessionID, processID string) *Error {
	return newError(ErrProcessNotFound, "session %s has no managed process with process_id=%s", sessionID, processID).
		With("session_id", sessionID).With("process_id", processID)
}

// ProcessConflict reports a managed process in the wrong state for the call.
func ProcessConflict(sessionID, processID, format string, args ...any) *Error {
	return newError(ErrProcessConflict, format, args...).
		With("session_id", sessionID).With("process_id", processID)
}

// CapacityExceeded reports a configured limit reached; limit names it.
func CapacityExceeded(limit string, value int, format string, args ...any) *Error {
	return newError(ErrCapacityExceeded, format, args...).With("limit", limit).With("value", value)
}
