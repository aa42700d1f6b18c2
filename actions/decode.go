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
		return boxerr.Validation("params", "params must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return boxerr.Validation("params", "params must be a single JSON object")
	}
	return nil
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
	spec := runtime.DefaultSpec()
	if err := decodeSpecInto(raw, &spec, &spec); err != nil {
		return runtime.Spec{}, err
	}
	return spec, nil
}

// decodeSpecInto decodes raw strictly into v, a struct that is spec or
// embeds it next to a method's own members, then normalises spec.
func decodeSpecInto(raw json.RawMessage, spec *runtime.Spec, v any) error {
	if err := DecodeParams(raw, v); err != nil {
		return err
	}
	// The reference defaults workdir to mount_path when workdir is absent,
	// null or empty.
	if strings.TrimSpace(spec.Workdir) == "" {
		spec.Workdir = spec.MountPath
	}
	return spec.Normalize()
}
