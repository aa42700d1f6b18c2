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
package relay
