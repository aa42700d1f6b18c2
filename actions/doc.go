// Package actions is boxrt's method catalogue: one file per method (or
// small family), each a typed function func(ctx, P) (R, error) registered
// once in New; a generic adapter (method.go) decodes and validates P,
// calls it and encodes R once. Decoding params is its concern: strict JSON
// decoding (decode.go: unknown fields and wrong types are
// BoxValidationErrors naming the field), used for every method's params,
// for session specs and, handed to runtime.Config.Merge, for configuration
// patches. It also owns the mapping from typed Go
// errors to the wire form using internal/boxerr's table (errors.go).
//
// Tenancy (tenancy*.go, fence.go, admission.go) wraps the Dispatcher as
// LangBot's Box runtime does: action scopes, the trusted instance, session
// ids namespaced per Workspace placement and mapped back in answers, the
// generation fence, and admission grants. Admission and the fence run as a
// gate the method adapter calls on the typed params, decoded once (no
// rewriting of the JSON). The runtime below it stays tenant-agnostic: it
// only ever sees physical session ids.
package actions
