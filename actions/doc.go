// Package actions is boxrt's method catalogue: one file per method (or
// small family), each a typed function func(ctx, P) (R, error) registered
// once in New; a generic adapter (method.go) decodes and validates P,
// calls it and encodes R once. Decoding params is its concern: strict JSON
// decoding (decode.go: unknown fields and wrong types are
// BoxValidationErrors naming the field), used for every method's params,
// for session specs and, handed to runtime.Config.Merge, for configuration
// patches. It also owns the mapping from typed Go
// errors to the wire form using runtime/boxerr's table (errors.go).
package actions
