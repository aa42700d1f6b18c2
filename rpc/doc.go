// Package rpc is boxrt's RPC plumbing: one frame loop per connection over
// line-framed stdio or WebSocket (coder/websocket) text messages, or over
// a message transport the caller brings (ServeFrames: a dial-out
// runtime's logical connection), with a
// pluggable Codec for the envelope (JSON-RPC 2.0, and LangBot's
// action-RPC envelope with its stdio chunk framing). The loop owns what every envelope shares:
// frame size limits, decoding each frame once, the per-connection
// scheduler (a running bound and a bounded queue with per-session turns:
// queue.go), back-pressure on a peer that does not read, cancellation when the connection ends or by the
// LSP-style $/cancelRequest notification, encoding each answer once,
// coalesced writes, and server-initiated notifications (Notify,
// NotifyQueued). It also owns bearer-token authentication, the Host/Origin guard in
// front of every HTTP route, and the encoding of errors into wire errors. jsonrpc2 contributes its Error type; its Conn
// is the reconnect client's, not the server's.
//
// It knows nothing about sandboxes: it serves any Handler, and an
// ErrorEncoder supplied by the caller decides how a Go error looks on the
// wire.
package rpc
