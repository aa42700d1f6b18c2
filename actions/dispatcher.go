package actions

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
)

// method serves one JSON-RPC method.
type method func(ctx context.Context, req *rpc.Request) (any, error)

// Server is what the actions need from the process around them.
type Server struct {
	Version string
	// RelayURL returns the relay's base URL ("" when no listener runs).
	RelayURL func() string
	// RelayToken is returned over stdio only, when boxrt generated it.
	RelayToken string
}

// Dispatcher routes requests to methods. It implements rpc.Handler.
type Dispatcher struct {
	rt      *runtime.Runtime
	server  Server
	methods map[string]method
	errors  errorRing
}

// New returns a Dispatcher with every method that works registered.
func New(rt *runtime.Runtime, server Server) *Dispatcher {
	d := &Dispatcher{rt: rt, server: server}
	d.methods = map[string]method{
		"__ping":               d.ping,
		"box_init":             d.init,
		"box_health":           d.health,
		"box_status":           d.status,
		"box_get_backend_info": d.backendInfo,
		"box_shutdown":         d.shutdown,
		"box_exec":             d.exec,
		"box_create_session":   d.createSession,
		"box_get_session":      d.getSession,
		"box_get_sessions":     d.getSessions,
		"box_delete_session":   d.deleteSession,

		"box_start_managed_process": d.startProcess,
		"box_get_managed_process":   d.getProcess,
		"box_stop_managed_process":  d.stopProcess,
	}
	return d
}

// Register adds (or replaces) a method; used to plug in method families
// that live with their own state, such as the skill store.
func (d *Dispatcher) Register(name string, fn func(ctx context.Context, params json.RawMessage, transport string) (any, error)) {
	d.methods[name] = func(ctx context.Context, req *rpc.Request) (any, error) {
		return fn(ctx, req.Params, req.Transport)
	}
}

// Methods lists the registered method names.
func (d *Dispatcher) Methods() []string {
	out := make([]string, 0, len(d.methods))
	for name := range d.methods {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Handle implements rpc.Handler. Failures are also kept in the ring of
// recent errors box_status reports.
func (d *Dispatcher) Handle(ctx context.Context, req *rpc.Request) (any, error) {
	var res any
	var err error
	if m, ok := d.methods[req.Method]; ok {
		res, err = m(ctx, req)
	} else {
		err = &rpc.MethodNotFoundError{Method: req.Method}
	}
	if err != nil {
		e := rpc.Encode(EncodeError, err)
		d.errors.add(RecentError{Time: time.Now().UTC(), Method: req.Method, Type: e.Type, Code: e.Code,
			Message: truncateText(e.Message, 500), SessionID: sessionIDOf(req.Params)})
	}
	return res, err
}

// noParams checks that params is empty.
func noParams(raw json.RawMessage) error {
	var none struct{}
	return backends.DecodeParams(raw, &none)
}
