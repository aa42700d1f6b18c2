package actions

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// handler is one method as the dispatcher calls it: raw params in, the
// encoded result out.
type handler func(ctx context.Context, params json.RawMessage) (json.RawMessage, error)

// A params type may refine how method reads it, by implementing on its
// pointer:
type (
	// paramsDecoder replaces the strict object decoding (the session spec
	// has its own).
	paramsDecoder interface{ decodeParams(json.RawMessage) error }
	// defaulter sets the values of members the caller leaves out.
	defaulter interface{ setDefaults() }
	// validator checks (and normalises) the decoded params.
	validator interface{ validate() error }
)

// none is the params of a method that takes none: an empty object, null or
// nothing.
type none struct{}

// A gate is a layer's check of a request between the decoding of its params
// and their validation (the tenancy's admission and generation fence): it
// sees the typed params, may hold them to a policy, and its refusal comes
// before any error of the params' own. A layer hands it to the method
// through the context (withGate).
type gate func(ctx context.Context, req decoded) error

// decoded is a request as a gate sees it.
type decoded struct {
	// params points to the method's params P, decoded, not yet validated.
	params any
	// err is the decoding's error, which the method reports after the gate.
	err error
	// read: the params were an object whose members were read (see
	// membersRead); otherwise params holds only P's defaults.
	read bool
}

type gateKey struct{}

// withGate returns ctx with g, for the method the request names.
func withGate(ctx context.Context, g gate) context.Context {
	return context.WithValue(ctx, gateKey{}, g)
}

// method adapts a typed method to the wire: decode the params into P
// strictly (unknown fields and wrong types are BoxValidationErrors naming
// the field), pass them through the context's gate, validate them, call
// fn, and encode its result once — with the caller's session ids read back
// as logical ids when it runs in a tenant's placement.
func method[P, R any](fn func(context.Context, P) (R, error)) handler {
	return func(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
		var p P
		err := decodeMembers(raw, &p)
		if g, _ := ctx.Value(gateKey{}).(gate); g != nil {
			if gerr := g(ctx, decoded{params: &p, err: err, read: membersRead(raw, err)}); gerr != nil {
				return nil, gerr
			}
			ctx = withGate(ctx, nil) // the gate is this request's, not its callees'
		}
		if err == nil {
			err = validateParams(&p)
		}
		if err != nil {
			return nil, err
		}
		r, err := fn(ctx, p)
		if err != nil {
			return nil, err
		}
		if pl, ok := tenant.FromContext(ctx); ok {
			r = logicalResult(pl, r)
		}
		return encodeResult(r)
	}
}

// decodeParams decodes and validates params into p.
func decodeParams[P any](raw json.RawMessage, p *P) error {
	if err := decodeMembers(raw, p); err != nil {
		return err
	}
	return validateParams(p)
}

// decodeMembers decodes params into p; what it read stays in p on error.
func decodeMembers[P any](raw json.RawMessage, p *P) error {
	if d, ok := any(p).(paramsDecoder); ok {
		return d.decodeParams(raw)
	}
	if d, ok := any(p).(defaulter); ok {
		d.setDefaults()
	}
	// The heartbeat and most reads send {}: decoding it would change
	// nothing, so it is not decoded.
	if emptyParams(raw) {
		return nil
	}
	return DecodeParams(raw, p)
}

func validateParams[P any](p *P) error {
	if v, ok := any(p).(validator); ok {
		return v.validate()
	}
	return nil
}

func emptyParams(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "{}" || string(t) == "null"
}

var emptyObject = json.RawMessage("{}")

func encodeResult[R any](r R) (json.RawMessage, error) {
	if _, ok := any(r).(struct{}); ok {
		return emptyObject, nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, boxerr.Failure("cannot encode the result: %v", err).Wrap(err)
	}
	return b, nil
}
