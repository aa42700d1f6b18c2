package e2bapi

import (
	"encoding/json"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// apiError is E2B's error body (the OpenAPI spec's Error): the SDKs map
// its code (401, 404, 409, 429, 503) to their own error classes.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// writeRuntimeError answers a runtime failure with the status boxrt's
// other HTTP routes give it.
func writeRuntimeError(w http.ResponseWriter, err error) {
	writeError(w, boxerr.HTTPStatus(err), err.Error())
}

// connectError is a runtime failure as a Connect error, by the same
// status table (nil stays nil).
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code := connect.CodeInternal
	switch boxerr.HTTPStatus(err) {
	case http.StatusNotFound:
		code = connect.CodeNotFound
	case http.StatusConflict:
		code = connect.CodeAlreadyExists
	case http.StatusBadRequest:
		code = connect.CodeInvalidArgument
	case http.StatusForbidden:
		code = connect.CodePermissionDenied
	case http.StatusTooManyRequests:
		code = connect.CodeResourceExhausted
	case http.StatusServiceUnavailable:
		code = connect.CodeUnavailable
	}
	return connect.NewError(code, err)
}

// writeConnectError answers a Connect call refused before its handler
// runs (no sandbox, bad token): the HTTP status and JSON body of a Connect
// unary error, which streaming clients read by the status alone.
func writeConnectError(w http.ResponseWriter, status int, code connect.Code, msg string) {
	writeJSON(w, status, map[string]string{"code": code.String(), "message": msg})
}
