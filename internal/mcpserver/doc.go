// Package mcpserver serves boxrt as Model Context Protocol tools
// (`boxrt mcp`, and /mcp on the listener when asked): run_command,
// start_command, read_command_output, stop_command, the file tools and the
// session tools, each a call into the method catalogue through the same
// rpc.Handler (the tenancy layer) every JSON-RPC request passes, so a tool
// cannot step around tenancy, admission or validation.
//
// It owns the tools' schemas and descriptions, the mapping of their
// arguments onto catalogue methods and of the answers onto tool results
// (boxrt's failures and non-zero exits become isError results a model
// reads), a command's streamed output as progress notifications, and the
// sessions of an MCP connection: one default session per connection,
// created on first use and deleted when the connection ends, next to the
// sessions a tool names, which outlive it. The protocol itself is the
// official Go SDK's (github.com/modelcontextprotocol/go-sdk).
package mcpserver
