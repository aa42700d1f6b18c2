package boxerr

// Kind is one row of the wire error table: a sentinel for errors.Is, and what
// the wire says about errors of that kind.
type Kind struct {
	// Type is the wire type name, e.g. "BoxValidationError". Wire messages
	// start with "<Type>: " so hosts that match on it as a substring work.
	Type string
	// Code is the JSON-RPC error code.
	Code int64
	// Retryable is whether the same call may succeed later unchanged.
	Retryable bool
}

func (k *Kind) Error() string { return k.Type }

// The table. docs/protocol.md lists the same rows; a test pins the two.
var (
	ErrBox                = &Kind{"BoxError", -32000, false}
	ErrValidation         = &Kind{"BoxValidationError", -32602, false}
	ErrBackendUnavailable = &Kind{"BoxBackendUnavailableError", -32001, true}
	ErrRuntimeUnavailable = &Kind{"BoxRuntimeUnavailableError", -32002, true}
	ErrSessionConflict    = &Kind{"BoxSessionConflictError", -32003, false}
	ErrSessionNotFound    = &Kind{"BoxSessionNotFoundError", -32004, false}
	ErrProcessConflict    = &Kind{"BoxManagedProcessConflictError", -32005, false}
	ErrProcessNotFound    = &Kind{"BoxManagedProcessNotFoundError", -32006, false}
	ErrCapacityExceeded   = &Kind{"BoxCapacityExceededError", -32007, true}
	ErrAdmission          = &Kind{"BoxAdmissionError", -32008, false}
	ErrReadiness          = &Kind{"BoxReadinessError", -32009, false}
	// ErrPermission: a tenant context that is missing, names another
	// instance, or carries a stale placement generation. The reference
	// raises Python's PermissionError, and hosts match that name.
	ErrPermission = &Kind{"PermissionError", -32010, false}
	// ErrFileNotFound: a session path (box_fs_*, the files endpoint) names
	// nothing. -32010 is left to tenancy's PermissionError.
	ErrFileNotFound = &Kind{"BoxFileNotFoundError", -32011, false}
	// ErrSnapshotCorrupted: a stored snapshot failed its checksum or does
	// not decode; it is never restored.
	ErrSnapshotCorrupted = &Kind{"BoxSnapshotCorruptedError", -32015, false}
)

// Protocol kinds: produced by the wire layer before any method runs. They
// share the table so a client decodes every code the server can send.
var (
	ErrParse          = &Kind{"ParseError", -32700, false}
	ErrInvalidRequest = &Kind{"InvalidRequest", -32600, false}
	ErrMethodNotFound = &Kind{"MethodNotFound", -32601, false}
	ErrInternal       = &Kind{"InternalError", -32603, false}
)

// Kinds is the whole table, boxrt's own kinds first.
var Kinds = []*Kind{
	ErrBox, ErrValidation, ErrBackendUnavailable, ErrRuntimeUnavailable,
	ErrSessionConflict, ErrSessionNotFound, ErrProcessConflict, ErrProcessNotFound,
	ErrCapacityExceeded, ErrAdmission, ErrReadiness, ErrPermission, ErrFileNotFound, ErrSnapshotCorrupted,
	ErrParse, ErrInvalidRequest, ErrMethodNotFound, ErrInternal,
}

// ByCode returns the kind with the given code, or nil.
func ByCode(code int64) *Kind {
	for _, k := range Kinds {
		if k.Code == code {
			return k
		}
	}
	return nil
}
