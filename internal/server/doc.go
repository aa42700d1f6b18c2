// Package server is boxrt serve once its flags are read: it locks the
// state directory, keeps or generates the control token, opens the
// listener, builds the runtime and wires the method catalogue, the tenancy
// layer, the frame loop (or, for boxrt mcp, the MCP server), the relay
// and the HTTP routes around it; Run serves until the context ends or the
// stdio peer hangs up (with --connect it also dials the host and serves
// the frame loop and the routes over that connection: dialout.go), and Close
// shuts everything down in the order that loses nothing (relay peers,
// connections, listener, runtime). It also owns what only a serving
// process needs: the Prometheus metrics, the request log line, returning
// memory after a burst, the GOMAXPROCS floor and a stdio stdout pipe
// large enough for streamed output.
package server
