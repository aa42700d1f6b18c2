package actions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime/skills"
)

func TestEncodeError(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		typ       string
		code      int64
		retryable bool
		message   string
		details   map[string]any
	}{
		{name: "cancelled", err: fmt.Errorf("exec: %w", context.Canceled), typ: "BoxRuntimeUnavailableError", code: -32002, retryable: true,
			message: "request cancelled: exec: context canceled"},
		{name: "deadline", err: context.DeadlineExceeded, typ: "BoxRuntimeUnavailableError", code: -32002, retryable: true,
			message: "request cancelled: context deadline exceeded"},
		{name: "validation names the field", err: boxerr.Validation("cmd", "cmd is required"), typ: "BoxValidationError", code: -32602,
			message: "cmd is required", details: map[string]any{"field": "cmd"}},
		{name: "typed error wrapped by context keeps its type", err: fmt.Errorf("while starting: %w", boxerr.SessionNotFound("s1")),
			typ: "BoxSessionNotFoundError", code: -32004, message: "session s1 not found", details: map[string]any{"session_id": "s1"}},
		{name: "retryable kind", err: boxerr.CapacityExceeded("max_sessions", 2, "too many"), typ: "BoxCapacityExceededError", code: -32007,
			retryable: true, message: "too many", details: map[string]any{"limit": "max_sessions", "value": 2}},
		{name: "one error marked retryable", err: &boxerr.Error{Kind: boxerr.ErrBox, Msg: "engine hiccup", Retryable: true},
			typ: "BoxError", code: -32000, retryable: true, message: "engine hiccup"},
		{name: "untyped error is a BoxError", err: errors.New("disk on fire"), typ: "BoxError", code: -32000, message: "disk on fire"},
		{name: "skill store failure is typed", err: skillErr(errors.New("read dir: EIO")), typ: "BoxError", code: -32000, message: "read dir: EIO"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := EncodeError(tc.err)
			assert.Equal(t, tc.typ, e.Type)
			assert.Equal(t, tc.code, e.Code)
			assert.Equal(t, tc.retryable, e.Retryable)
			assert.Equal(t, tc.message, e.Message)
			assert.Equal(t, tc.details, e.Details)
		})
	}
}

// call runs a method through the dispatcher the way the server does.
func call(d *Dispatcher, method, params string) (json.RawMessage, error) {
	return d.Handle(context.Background(), &rpc.Request{Method: method, Params: json.RawMessage(params), ID: json.RawMessage("1")})
}

func TestParamsDecoding(t *testing.T) {
	tests := []struct {
		name   string
		decode func(raw json.RawMessage) (any, error)
		params string
		want   any    // the decoded params when field is ""
		field  string // the field a BoxValidationError names
	}{
		{name: "absent params are empty", decode: decodeAs[none], params: "", want: none{}},
		{name: "null params are empty", decode: decodeAs[none], params: "null", want: none{}},
		{name: "whitespace around {}", decode: decodeAs[none], params: " {} ", want: none{}},
		{name: "member on a method that takes none", decode: decodeAs[none], params: `{"x":1}`, field: "x"},
		{name: "array params", decode: decodeAs[none], params: `[1,2]`, field: "params"},
		{name: "two objects", decode: decodeAs[sessionRef], params: `{"session_id":"a"} {}`, field: "params"},
		{name: "unknown field", decode: decodeAs[sessionRef], params: `{"session_id":"a","bogus":1}`, field: "bogus"},
		{name: "wrong type", decode: decodeAs[sessionRef], params: `{"session_id":5}`, field: "session_id"},
		{name: "session_id trimmed", decode: decodeAs[sessionRef], params: `{"session_id":"  a "}`, want: sessionRef{SessionID: "a"}},
		{name: "blank session_id", decode: decodeAs[sessionRef], params: `{"session_id":"  "}`, field: "session_id"},
		{name: "missing session_id", decode: decodeAs[sessionRef], params: `{}`, field: "session_id"},
		{name: "process ref keeps an empty process_id", decode: decodeAs[processRef], params: `{"session_id":"s"}`, want: processRef{SessionID: "s"}},
		{name: "start process needs a spec", decode: decodeAs[startProcessParams], params: `{"session_id":"s"}`, field: "spec"},
		{name: "defaults for an empty object", decode: decodeAs[listSkillFilesParams], params: `{}`,
			want: listSkillFilesParams{Path: ".", MaxEntries: skills.DefaultListEntries}},
		{name: "an explicit value replaces the default", decode: decodeAs[listSkillFilesParams], params: `{"name":"n","max_entries":0}`,
			want: listSkillFilesParams{Name: "n", Path: ".", MaxEntries: 0}},
		{name: "fractional integer", decode: decodeAs[listSkillFilesParams], params: `{"max_entries":1.5}`, field: "max_entries"},
		{name: "zip needs a source", decode: decodeAs[zipParams], params: `{}`, field: "file_key"},
		{name: "zip takes one source", decode: decodeAs[installZipParams], params: `{"file_key":"k","zip_base64":"UEs="}`, field: "zip_base64"},
		{name: "zip defaults", decode: decodeAs[installZipParams], params: `{"file_key":"k"}`,
			want: installZipParams{zipParams: zipParams{FileKey: "k", Filename: "skill.zip", TargetSuffix: "upload"}}},
		{name: "chunk position required", decode: decodeAs[fileChunkParams], params: `{"file_key":"k","chunk_amount":1}`, field: "chunk_index"},
		{name: "create skill needs a skill", decode: decodeAs[createSkillParams], params: `{}`, field: "skill"},
		{name: "spec unknown field", decode: decodeAs[specParams], params: `{"session_id":"s","cmd":"true","bogus":1}`, field: "bogus"},
		{name: "config patch is passed on as sent", decode: decodeAs[configPatch], params: `{"limits":{}}`,
			want: configPatch{raw: json.RawMessage(`{"limits":{}}`)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.decode(json.RawMessage(tc.params))
			if tc.field != "" {
				var be *boxerr.Error
				require.ErrorAs(t, err, &be)
				assert.Equal(t, boxerr.ErrValidation, be.Kind)
				assert.Equal(t, tc.field, be.Details["field"])
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func decodeAs[P any](raw json.RawMessage) (any, error) {
	var p P
	err := decodeParams(raw, &p)
	return p, err
}

func TestDispatcher(t *testing.T) {
	d := New(nil, nil, Server{})
	tests := []struct {
		name    string
		method  string
		params  string
		result  string
		errType string
	}{
		{name: "ping", method: "__ping", params: "{}", result: "{}"},
		{name: "ping without params", method: "__ping", result: "{}"},
		{name: "ping with a member", method: "__ping", params: `{"session_id":"s9","x":1}`, errType: "BoxValidationError"},
		{name: "unknown method", method: "box_nope", params: `{"session_id":"s8"}`, errType: "MethodNotFound"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := call(d, tc.method, tc.params)
			if tc.errType == "" {
				require.NoError(t, err)
				assert.JSONEq(t, tc.result, string(res))
				return
			}
			require.Error(t, err)
			assert.Equal(t, tc.errType, rpc.Encode(EncodeError, err).Type)
		})
	}
	t.Run("failures are kept for box_status, newest first, with the session", func(t *testing.T) {
		recent := d.errors.newestFirst()
		require.Len(t, recent, 2)
		assert.Equal(t, RecentError{Time: recent[0].Time, Method: "box_nope", Type: "MethodNotFound", Code: -32601,
			Message: `method "box_nope" not found`, SessionID: "s8"}, recent[0])
		assert.Equal(t, "s9", recent[1].SessionID)
	})
	t.Run("every core method is registered", func(t *testing.T) {
		assert.Len(t, d.Methods(), 55)
		assert.Contains(t, d.Methods(), "box_install_skill_zip")
		assert.Contains(t, d.Methods(), "__file_chunk")
		assert.Contains(t, d.Methods(), "box_fork_session")
	})
}

func TestMethodAdapter(t *testing.T) {
	tests := []struct {
		name    string
		h       handler
		params  string
		result  string
		errKind *boxerr.Kind
	}{
		{name: "result encoded once", h: method(func(context.Context, none) (map[string]int, error) { return map[string]int{"n": 1}, nil }),
			result: `{"n":1}`},
		{name: "empty struct result is {}", h: method(func(context.Context, none) (struct{}, error) { return struct{}{}, nil }), result: `{}`},
		{name: "method error passes through", h: method(func(context.Context, none) (struct{}, error) { return struct{}{}, boxerr.SessionNotFound("x") }),
			errKind: boxerr.ErrSessionNotFound},
		{name: "params refused before the call", h: method(func(context.Context, sessionRef) (struct{}, error) { panic("called") }),
			params: `{}`, errKind: boxerr.ErrValidation},
		{name: "unencodable result is a BoxError", h: method(func(context.Context, none) (chan int, error) { return make(chan int), nil }),
			errKind: boxerr.ErrBox},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.h(context.Background(), json.RawMessage(tc.params))
			if tc.errKind != nil {
				require.ErrorIs(t, err, tc.errKind)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.result, string(res))
		})
	}
}
