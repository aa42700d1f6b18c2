// Package relay serves the managed-process WebSocket relay: a host's MCP
// client talks to a stdio MCP server running inside a session. Each
// incoming text frame becomes one line on the process's stdin; each stdout
// line becomes exactly one text frame. The runtime drains stdout even while
// nobody is attached and replays it on the next attach; the latest attacher
// takes over. The relay checks its own credentials: a process's relay_token
// opens that process alone, the control token (operator) opens every one.
//
// Files (files.go) is the other HTTP surface of a session: its files
// streamed in and out with GET and PUT, behind the control token.
//
// Ports (ports.go) reverse-proxies a session's exposed TCP port (HTTP and
// WebSocket) to whoever holds that exposure's token, never the control
// token's holder as such; its large bodies move by splice (portsplice.go).
package relay
