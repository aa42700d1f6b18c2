package actions

import (
	"context"
	"errors"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/rpc"
)

// errorKind is one row of the wire error table (docs/protocol.md).
type errorKind struct {
	sentinel  error
	code      int64
	retryable bool
}

var errorTable = []errorKind{
	{backends.ErrValidation, -32602, false},
	{backends.ErrBackendUnavailable, -32001, true},
	{backends.ErrRuntimeUnavailable, -32002, true},
	{backends.ErrSessionConflict, -32003, false},
	{backends.ErrSessionNotFound, -32004, false},
	{backends.ErrProcessConflict, -32005, false},
	{backends.ErrProcessNotFound, -32006, false},
	{backends.ErrCapacityExceeded, -32007, true},
	{backends.ErrBox, -32000, false},
}

// EncodeError maps a Go error to its wire form. Typed *backends.Error values
// keep their details; anything else is a BoxError.
func EncodeError(err error) *rpc.Error {
	if errors.Is(err, rpc.ErrBusy) {
		return &rpc.Error{Code: -32002, Type: backends.ErrRuntimeUnavailable.Error(), Retryable: true,
			Message: "Runtime connection is busy (max 128 concurrent requests)"}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &rpc.Error{Code: -32002, Type: backends.ErrRuntimeUnavailable.Error(), Retryable: true,
			Message: "request cancelled: " + err.Error()}
	}
	var be *backends.Error
	if errors.As(err, &be) {
		for _, k := range errorTable {
			if be.Kind == k.sentinel {
				return &rpc.Error{Code: k.code, Type: be.Type(), Message: be.Msg,
					Retryable: k.retryable || be.Retryable, Details: be.Details}
			}
		}
	}
	return &rpc.Error{Code: -32000, Type: backends.ErrBox.Error(), Message: err.Error()}
}
