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

// method adapts a typed method to the wire: decode the params into P
// strictly (unknown fields and wrong types are BoxValidationErrors naming
// the field), validate them, call fn, and encode its result once — with
// the caller's session ids read back as logical ids when it runs in a
// tenant's placement.
func method[P, R any](fn func(context.Context, P) (R, error)) handler {
	return func(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
		var p P
		if err := decodeParams(raw, &p); err != nil {
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

func decodeParams[P any](raw json.RawMessage, p *P) error {
	var err error
	if d, ok := any(p).(paramsDecoder); ok {
		err = d.decodeParams(raw)
	} else {
		if d, ok := any(p).(defaulter); ok {
			d.setDefaults()
		}
		// The heartbeat and most reads send {}: decoding it would change
		// nothing, so it is not decoded.
		if !emptyParams(raw) {
			err = DecodeParams(raw, p)
		}
	}
	if err != nil {
		return err
	}
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
