// Package actions is boxrt's method catalogue: one file per method (or
// small family), each a typed function func(ctx, P) (R, error) registered
// once in New; a generic adapter (method.go) decodes and validates P,
// calls it and encodes R once. It also owns the mapping from typed Go
// errors to the wire form using runtime/boxerr's table (errors.go).
package actions
