// Package dialout is the wire of a runtime that dials its host
// (`boxrt serve --connect`), shared by both ends: boxrt's side
// (internal/server) and the host's listener (reconnect).
//
// One WebSocket, opened by the runtime, carries two things:
//
//   - text messages: the JSON-RPC frames of one logical connection (Conn),
//     which outlives the WebSocket that carries it. Each side numbers the
//     frames it sends and counts those it received; the handshake at the
//     start of every WebSocket (Hello, Welcome) names the logical
//     connection and both counts, so each side replays from its replay
//     buffer what the other missed. A logical connection not resumed
//     within its window ends.
//   - binary messages: streams (Mux), each a net.Conn the host opens and
//     the runtime serves HTTP on (the relay's WebSockets, the files
//     endpoint), with per-stream flow control. Streams do not survive
//     their WebSocket.
//
// It also owns the backoff rule between dial attempts and the WebSocket
// keepalive both sides run. It knows nothing about boxes or JSON-RPC
// methods beyond telling answers from notifications.
package dialout
