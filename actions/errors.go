package actions

import (
	"context"
	"errors"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
)

// EncodeError maps a Go error to its wire form using boxerr's table. Typed
// *boxerr.Error values keep their details; anything else is a BoxError.
func EncodeError(err error) *rpc.Error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return wireError(boxerr.ErrRuntimeUnavailable, "request cancelled: "+err.Error(), nil)
	}
	var be *boxerr.Error
	if errors.As(err, &be) {
		e := wireError(be.Kind, be.Msg, be.Details)
		e.Retryable = be.IsRetryable()
		return e
	}
	return wireError(boxerr.ErrBox, err.Error(), nil)
}

func wireError(k *boxerr.Kind, msg string, details map[string]any) *rpc.Error {
	return &rpc.Error{Code: k.Code, Type: k.Type, Message: msg, Retryable: k.Retryable, Details: details}
}
