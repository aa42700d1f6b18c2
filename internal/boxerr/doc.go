// Package boxerr owns boxrt's typed errors and their one wire table: each
// kind's type name, JSON-RPC code and whether a caller may retry.
//
// It is a leaf: it imports nothing of boxrt, so backends, the runtime, the
// skill store, the method catalogue, the rpc layer and the Go client can all
// build and match errors without importing each other. Go code matches with
// errors.Is against the Kind sentinels (ErrValidation, …) and errors.As
// against *Error for details; only the wire layers turn them into JSON.
package boxerr
