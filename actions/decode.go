package actions

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"unicode"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

// DecodeParams decodes a JSON-RPC params object into v strictly: params must
// be an object (or absent/null), unknown fields and wrong types are refused
// with a BoxValidationError naming the field.
func DecodeParams(raw []byte, v any) error {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		trimmed = []byte("{}")
	}
	if trimmed[0] != '{' {
		return boxerr.Validation("params", "params must be a JSON object").Wrap(errNotOneObject)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return boxerr.Validation("params", "params must be a single JSON object").Wrap(errNotOneObject)
	}
	return nil
}

// errNotOneObject is the cause of the refusal of params that are not one
// JSON object (an array, a string, two objects).
var errNotOneObject = errors.New("params are not one JSON object")

// membersRead reports whether a decoding that ended in err read the members
// of raw: raw is one well-formed JSON object (an empty one included), so
// whatever err says concerns a member. Absent or null params, params that
// are not an object and malformed JSON read none (encoding/json checks the
// whole value before it decodes any of it).
func membersRead(raw json.RawMessage, err error) bool {
	t := bytes.TrimSpace(raw)
	var syntax *json.SyntaxError
	return len(t) > 0 && t[0] == '{' && !errors.Is(err, errNotOneObject) &&
		!errors.As(err, &syntax) && !errors.Is(err, io.ErrUnexpectedEOF)
}

// refusedMember reports whether err is the decoding's refusal of the
// top-level member name (unknown, or of the wrong type): it was sent.
func refusedMember(err error, name string) bool {
	var be *boxerr.Error
	return errors.As(err, &be) && be.Kind == boxerr.ErrValidation && be.Details["field"] == name
}

func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := wirePath(typeErr.Field)
		if field == "" {
			field = "params"
		}
		return boxerr.Validation(field, "%s must be %s, got JSON %s", field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value).Wrap(err)
	case errors.As(err, &syntaxErr):
		return boxerr.Validation("params", "params are not valid JSON: %v", err).Wrap(err)
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		field := name
		if field == "" {
			field = "params"
		}
		return boxerr.Validation(field, "unknown field %q", name).Wrap(err)
	}
	return boxerr.Validation("params", "invalid params: %s", strings.TrimPrefix(msg, "json: ")).Wrap(err)
}

// wirePath removes from an error's field path the Go names of embedded
// structs (runtime.Spec embeds backends.SandboxSpec, which embeds
// backends.Sandbox): encoding/json writes "SandboxSpec.Sandbox.memory_mb"
// where the wire has "memory_mb". Every JSON key of boxrt's params is lower
// case, so an upper-case element can only be such a name.
func wirePath(field string) string {
	parts := strings.Split(field, ".")
	keep := parts[:0]
	for _, p := range parts {
		if p != "" && !unicode.IsUpper(rune(p[0])) {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, ".")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "map", "struct":
		return "an object"
	case "slice", "array":
		return "an array"
	}
	return "of type " + goKind
}

// DecodeSpec parses a box_exec / box_create_session params object, applying
// the reference defaults and validation. Unknown fields and wrong types are
// BoxValidationErrors naming the field.
func DecodeSpec(raw json.RawMessage) (runtime.Spec, error) {
	var p specParams
	if err := decodeParams(raw, &p); err != nil {
		return runtime.Spec{}, err
	}
	return p.spec, nil
}

// WireSpec is a session spec as the spec actions read it: runtime.Spec, with
// timeout_sec read through a pointer (it shadows the Spec's, one level
// deeper) so that a timeout left out is told from one sent: admission gives
// the first the policy's maximum where the method would give its default.
// It is exported because it is embedded in the params' wire structs (see
// LiveOptions).
type WireSpec struct {
	runtime.Spec
	TimeoutSec *int `json:"timeout_sec"`
}

// sessionSpec is a spec action's session spec between its decoding and its
// normalisation: where the tenancy's admission holds it to a policy.
type sessionSpec struct {
	spec        runtime.Spec
	timeoutSent bool
}

// specRequest is a spec action's params (box_exec, box_exec_start,
// box_create_session).
type specRequest interface{ specOf() *sessionSpec }

func (s *sessionSpec) specOf() *sessionSpec { return s }

// decodeMembers decodes raw strictly into v, a wire struct that is w or
// embeds it next to a method's own members, and keeps w's spec — what was
// read of it even when err says a member was refused.
func (s *sessionSpec) decodeMembers(raw json.RawMessage, w *WireSpec, v any) error {
	err := DecodeParams(raw, v)
	s.spec, s.timeoutSent = w.Spec, w.TimeoutSec != nil
	if s.timeoutSent {
		s.spec.TimeoutSec = *w.TimeoutSec
	}
	return err
}

// validate applies the spec's remaining defaults and its validation.
func (s *sessionSpec) validate() error {
	// The reference defaults workdir to mount_path when workdir is absent,
	// null or empty.
	if strings.TrimSpace(s.spec.Workdir) == "" {
		s.spec.Workdir = s.spec.MountPath
	}
	return s.spec.Normalize()
}
