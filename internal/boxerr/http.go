package boxerr

import (
	"errors"
	"net/http"
)

// TypeOf is the wire type name of err: its kind's, or "BoxError" for an
// error boxrt did not type.
func TypeOf(err error) string {
	var be *Error
	if errors.As(err, &be) {
		return be.Type()
	}
	var k *Kind
	if errors.As(err, &k) {
		return k.Type
	}
	return ErrBox.Type
}

// HTTPStatus is the one mapping of an error to an HTTP status, for every
// HTTP route boxrt serves (relay, files endpoint): a client of either reads
// the same status for the same failure.
func HTTPStatus(err error) int {
	switch {
	case errors.Is(err, ErrSessionNotFound), errors.Is(err, ErrProcessNotFound), errors.Is(err, ErrFileNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrProcessConflict), errors.Is(err, ErrSessionConflict):
		return http.StatusConflict
	case errors.Is(err, ErrValidation):
		var be *Error
		if errors.As(err, &be) && be.Details["reason"] == "read_only" {
			return http.StatusForbidden
		}
		return http.StatusBadRequest
	case errors.Is(err, ErrPermission):
		return http.StatusForbidden
	case errors.Is(err, ErrCapacityExceeded):
		return http.StatusTooManyRequests
	case errors.Is(err, ErrRuntimeUnavailable), errors.Is(err, ErrBackendUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
