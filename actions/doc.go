// Package actions is boxrt's method catalogue: one file per JSON-RPC method
// (or small family), each decoding and validating its params, calling the
// runtime and shaping the result. It also owns the mapping from typed Go
// errors to the wire form using runtime/boxerr's table (errors.go).
package actions
