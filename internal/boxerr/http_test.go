package boxerr

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestHTTPStatus(t *testing.T) {
	readOnly := Validation("path", "read-only").With("reason", "read_only")
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"session not found", SessionNotFound("s"), http.StatusNotFound},
		{"process not found, wrapped", fmt.Errorf("attach: %w", ProcessNotFound("s", "p")), http.StatusNotFound},
		{"file not found", FileNotFound("/x"), http.StatusNotFound},
		{"process conflict", ProcessConflict("s", "p", "running"), http.StatusConflict},
		{"validation", Validation("path", "bad"), http.StatusBadRequest},
		{"read-only path", readOnly, http.StatusForbidden},
		{"permission", Permission("other instance"), http.StatusForbidden},
		{"capacity", CapacityExceeded("max_sessions", 1, "full"), http.StatusTooManyRequests},
		{"runtime unavailable", RuntimeUnavailable("shutting down"), http.StatusServiceUnavailable},
		{"backend unavailable", BackendUnavailable("no engine"), http.StatusServiceUnavailable},
		{"untyped", errors.New("boom"), http.StatusInternalServerError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := HTTPStatus(c.err); got != c.want {
				t.Fatalf("HTTPStatus = %d, want %d", got, c.want)
			}
		})
	}
}

func TestTypeOf(t *testing.T) {
	if got := TypeOf(fmt.Errorf("x: %w", SessionNotFound("s"))); got != "BoxSessionNotFoundError" {
		t.Fatalf("TypeOf(wrapped) = %q", got)
	}
	if got := TypeOf(ErrCapacityExceeded); got != "BoxCapacityExceededError" {
		t.Fatalf("TypeOf(kind) = %q", got)
	}
	if got := TypeOf(errors.New("boom")); got != "BoxError" {
		t.Fatalf("TypeOf(untyped) = %q", got)
	}
}
