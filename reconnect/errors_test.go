package reconnect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"

	"github.com/sourcegraph/jsonrpc2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func wire(code int64, msg, data string) *jsonrpc2.Error {
	e := &jsonrpc2.Error{Code: code, Message: msg}
	if data != "" {
		raw := json.RawMessage(data)
		e.Data = &raw
	}
	return e
}

func TestFromWire(t *testing.T) {
	all := []error{ErrBox, ErrValidation, ErrBackendUnavailable, ErrRuntimeUnavailable, ErrSessionConflict,
		ErrSessionNotFound, ErrProcessConflict, ErrProcessNotFound, ErrCapacityExceeded,
		ErrParse, ErrInvalidRequest, ErrMethodNotFound, ErrInternal}
	tests := []struct {
		name      string
		in        *jsonrpc2.Error
		sentinel  error // nil: matches none
		typ       string
		retryable bool
	}{
		{"box error", wire(-32000, "BoxError: docker said no", `{"type":"BoxError","retryable":false}`), ErrBox, "BoxError", false},
		{"validation", wire(-32602, "BoxValidationError: cmd is required", `{"type":"BoxValidationError","retryable":false,"field":"cmd"}`), ErrValidation, "BoxValidationError", false},
		{"backend unavailable", wire(-32001, "BoxBackendUnavailableError: no backend", `{"type":"BoxBackendUnavailableError","retryable":true}`), ErrBackendUnavailable, "BoxBackendUnavailableError", true},
		{"runtime unavailable", wire(-32002, "BoxRuntimeUnavailableError: busy", `{"type":"BoxRuntimeUnavailableError","retryable":true}`), ErrRuntimeUnavailable, "BoxRuntimeUnavailableError", true},
		{"session conflict", wire(-32003, "BoxSessionConflictError: image differs", `{"type":"BoxSessionConflictError","retryable":false,"field":"image"}`), ErrSessionConflict, "BoxSessionConflictError", false},
		{"session not found", wire(-32004, "BoxSessionNotFoundError: s1", `{"type":"BoxSessionNotFoundError","retryable":false}`), ErrSessionNotFound, "BoxSessionNotFoundError", false},
		{"process conflict", wire(-32005, "BoxManagedProcessConflictError: running", `{"type":"BoxManagedProcessConflictError","retryable":false}`), ErrProcessConflict, "BoxManagedProcessConflictError", false},
		{"process not found", wire(-32006, "BoxManagedProcessNotFoundError: p", `{"type":"BoxManagedProcessNotFoundError","retryable":false}`), ErrProcessNotFound, "BoxManagedProcessNotFoundError", false},
		{"capacity", wire(-32007, "BoxCapacityExceededError: max_sessions", `{"type":"BoxCapacityExceededError","retryable":true,"limit":"max_sessions"}`), ErrCapacityExceeded, "BoxCapacityExceededError", true},
		{"parse", wire(-32700, "ParseError: bad json", `{"type":"ParseError","retryable":false}`), ErrParse, "ParseError", false},
		{"invalid request", wire(-32600, "InvalidRequest: no method", `{"type":"InvalidRequest","retryable":false}`), ErrInvalidRequest, "InvalidRequest", false},
		{"method not found", wire(-32601, `MethodNotFound: method "x" not found`, `{"type":"MethodNotFound","retryable":false,"method":"x"}`), ErrMethodNotFound, "MethodNotFound", false},
		{"no data: type from table, retryable default", wire(-32002, "shutting down", ""), ErrRuntimeUnavailable, "BoxRuntimeUnavailableError", true},
		{"data without retryable keeps the default", wire(-32004, "BoxSessionNotFoundError: x", `{"type":"BoxSessionNotFoundError"}`), ErrSessionNotFound, "BoxSessionNotFoundError", false},
		{"data overrides retryable", wire(-32000, "BoxError: transient", `{"type":"BoxError","retryable":true}`), ErrBox, "BoxError", true},
		{"unknown newer type keeps its name", wire(-32008, "BoxAdmissionError: not admitted", `{"type":"BoxAdmissionError","retryable":false}`), nil, "BoxAdmissionError", false},
		{"foreign server: type from message prefix", wire(-1, "BoxReadinessError: not ready", ""), nil, "BoxReadinessError", false},
		{"foreign server: plain message", wire(-1, "something broke", ""), nil, "", false},
		{"data not an object", wire(-32004, "BoxSessionNotFoundError: x", `"oops"`), ErrSessionNotFound, "BoxSessionNotFoundError", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := fromWire(tt.in)
			assert.Equal(t, tt.in.Code, e.Code)
			assert.Equal(t, tt.typ, e.Type)
			assert.Equal(t, tt.in.Message, e.Message, "message kept verbatim")
			assert.Equal(t, tt.retryable, e.Retryable)
			if tt.in.Data != nil {
				assert.JSONEq(t, string(*tt.in.Data), string(e.Data))
			}
			var err error = fmt.Errorf("box_exec: %w", e)
			for _, s := range all {
				assert.Equal(t, s == tt.sentinel, errors.Is(err, s), "errors.Is(%v)", s)
			}
			var got *Error
			require.True(t, errors.As(err, &got))
			assert.Same(t, e, got)
			assert.Nil(t, errors.Unwrap(got), "server errors have no local cause")
		})
	}
}

func TestErrorString(t *testing.T) {
	assert.Equal(t, "BoxSessionNotFoundError: s1", fromWire(wire(-32004, "BoxSessionNotFoundError: s1", "")).Error())
	assert.Equal(t, "BoxSessionNotFoundError: s1", (&Error{Code: -32004, Type: "BoxSessionNotFoundError", Message: "s1"}).Error())
	assert.Equal(t, "boom", (&Error{Code: -1, Message: "boom"}).Error())
}

func TestUnavailableError(t *testing.T) {
	e := unavailable(context.DeadlineExceeded, "box_exec: link lost")
	assert.True(t, errors.Is(e, ErrRuntimeUnavailable))
	assert.True(t, errors.Is(e, context.DeadlineExceeded), "the local cause stays reachable")
	assert.True(t, e.Retryable)
	assert.Equal(t, ErrRuntimeUnavailable.Code, e.Code)
	assert.Equal(t, "BoxRuntimeUnavailableError: box_exec: link lost", e.Error())
	assert.JSONEq(t, `{"type":"BoxRuntimeUnavailableError","retryable":true}`, string(e.Data))
}

func TestIsPermanent(t *testing.T) {
	assert.True(t, isPermanent(permanent(errors.New("exec: not found"))))
	assert.True(t, isPermanent(fmt.Errorf("hook: %w", fromWire(wire(-32602, "BoxValidationError: bad", "")))))
	assert.False(t, isPermanent(fromWire(wire(-32002, "BoxRuntimeUnavailableError: busy", ""))))
	assert.False(t, isPermanent(unavailable(errors.New("eof"), "lost")), "a lost link is worth retrying")
	assert.False(t, isPermanent(context.DeadlineExceeded))
}

// TestSentinelsCoverTheTable holds this package's sentinels to boxrt's wire
// error table: a kind added to internal/boxerr without a sentinel here (or
// a sentinel naming another kind) fails, so a host can match every error
// the server can send.
func TestSentinelsCoverTheTable(t *testing.T) {
	kinds := declaredErrVars(t, "../internal/boxerr/kind.go", func(e ast.Expr) string {
		if u, ok := e.(*ast.UnaryExpr); ok {
			if _, ok := u.X.(*ast.CompositeLit); ok {
				return "kind"
			}
		}
		return ""
	})
	sentinels := declaredErrVars(t, "errors.go", func(e ast.Expr) string {
		if sel, ok := e.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "boxerr" {
				return sel.Sel.Name
			}
		}
		return ""
	})
	for name := range kinds {
		if got, ok := sentinels[name]; !ok {
			t.Errorf("boxerr.%s has no reconnect.%s sentinel", name, name)
		} else if got != name {
			t.Errorf("reconnect.%s = boxerr.%s, want boxerr.%s", name, got, name)
		}
	}
	for name := range sentinels {
		if _, ok := kinds[name]; !ok {
			t.Errorf("reconnect.%s names no kind of the table", name)
		}
	}
	for _, k := range boxerr.Kinds {
		err := fromWire(wire(k.Code, k.Type+": x", ""))
		if !errors.Is(err, k) || err.Type != k.Type || err.Retryable != k.Retryable {
			t.Errorf("code %d decodes to %+v, want kind %s", k.Code, err, k.Type)
		}
	}
	if len(kinds) != len(boxerr.Kinds) {
		t.Errorf("kind.go declares %d kinds, boxerr.Kinds lists %d", len(kinds), len(boxerr.Kinds))
	}
}

// declaredErrVars parses file and returns its package-level Err* variables
// whose value pick accepts, mapped to what pick says of the value.
func declaredErrVars(t *testing.T, file string, pick func(ast.Expr) string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	require.NoError(t, err)
	out := map[string]string{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Err") || i >= len(vs.Values) {
					continue
				}
				if v := pick(vs.Values[i]); v != "" {
					out[name.Name] = v
				}
			}
		}
	}
	return out
}
