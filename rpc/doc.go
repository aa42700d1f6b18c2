// Package rpc is boxrt's JSON-RPC 2.0 plumbing on top of
// sourcegraph/jsonrpc2: line-framed stdio and WebSocket (coder/websocket)
// transports, frame validation (size, UTF-8, envelope, batches), per
// connection in-flight limits, bearer-token authentication, the Host/Origin
// guard in front of every HTTP route, and the encoding
// of typed errors into JSON-RPC error objects.
//
// It knows nothing about sandboxes: it serves any Handler, and an
// ErrorEncoder supplied by the caller decides how a Go error looks on the
// wire.
package rpc
