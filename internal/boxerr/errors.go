package boxerr

import "fmt"

// Error is a typed failure. Kind is one of the table's sentinels; Details are
// extra machine-readable facts (field, limit, …) carried in the wire error's
// data object. Details must never hold secrets.
type Error struct {
	Kind *Kind
	Msg  string
	// Retryable marks this one error retryable even where its kind is not.
	Retryable bool
	Details   map[string]any
	Err       error
}

func (e *Error) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrValidation) true for a validation *Error.
func (e *Error) Is(target error) bool { return target == error(e.Kind) }

func (e *Error) Unwrap() error { return e.Err }

// IsRetryable is what the wire's data.retryable says for e.
func (e *Error) IsRetryable() bool { return e.Retryable || e.Kind.Retryable }

// Type is the wire type name of the error, e.g. "BoxValidationError".
func (e *Error) Type() string { return e.Kind.Error() }

func newError(kind *Kind, format string, args ...any) *Error {
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
	return newError(ErrRuntimeUnavailable, format, args...)
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

// SnapshotCorrupted refuses a stored snapshot that does not verify.
func SnapshotCorrupted(snapshotID, format string, args ...any) *Error {
	return newError(ErrSnapshotCorrupted, format, args...).With("snapshot_id", snapshotID)
}

// FileNotFound reports a session path that names nothing.
func FileNotFound(path string) *Error {
	return newError(ErrFileNotFound, "%s: no such file or directory", path).With("path", path)
}

// Permission reports a tenant context the runtime cannot trust: missing,
// of another instance, or of a stale placement generation.
func Permission(format string, args ...any) *Error { return newError(ErrPermission, format, args...) }

// Admission reports a sandbox admission grant that is missing, stale or
// over its limits.
func Admission(format string, args ...any) *Error { return newError(ErrAdmission, format, args...) }

// Readiness reports that the runtime cannot serve managed sandboxes (a
// failed shared-workspace probe).
func Readiness(format string, args ...any) *Error { return newError(ErrReadiness, format, args...) }
