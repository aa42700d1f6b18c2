package cli

import (
	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/internal/server"
)

func mcpCommand() *cli.Command {
	return &cli.Command{
		Name:  "mcp",
		Usage: "serve sandboxes as Model Context Protocol tools (stdio, or Streamable HTTP with --listen)",
		Description: `Runs the runtime as an MCP server, so any MCP host (a desktop assistant,
an IDE agent, an agent framework) can use sandboxes as tools. By default it
speaks MCP over stdin/stdout (nothing else is written to stdout; logs go to
stderr) and ends when stdin does; a host starts it as a command, e.g.
  {"mcpServers": {"boxrt": {"command": "boxrt", "args": ["mcp"]}}}
With --listen ADDR it serves MCP's Streamable HTTP transport at
http://ADDR/mcp instead (with the routes serve has: /rpc/ws, the relay,
health), behind the control token ("Authorization: Bearer <token>"; from
--token-file or BOXRT_CONTROL_TOKEN, else generated into
STATE_DIR/control-token, as serve does).

Tools: run_command {command, timeout_sec?, session?} (its output streamed as
progress notifications when the client sends a progress token; a non-zero
exit is an error result with the exit code and output), start_command,
read_command_output, stop_command, read_file, write_file {path, content} or
{path, content_base64}, list_files, stat_file, remove_file,
create_session, list_sessions, delete_session, suspend_session,
snapshot_session, fork_session. Without a "session" argument a tool uses
the connection's own session, created on first use and deleted when the
connection ends; a named session, or create_session with persistent: true,
outlives it. boxrt's own failures are error results naming boxrt's error
type with a hint.

It takes serve's configuration, state directory and environment, and locks
the state directory the same way: one runtime (serve or mcp) per state
directory. See docs/protocol.md, "MCP server".`,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Usage: "serve MCP's Streamable HTTP at http://ADDR/mcp instead of stdio (port 0 picks a free port; a non-loopback address needs a configured token)"},
		}, runtimeFlags()...),
		Action: noArgs("mcp", func(c *cli.Context) error { return runServer(c, mcpOptions) }),
	}
}

// mcpOptions are serve's options for MCP: JSON-RPC's tenancy (no tenant
// context: one namespace), stdio unless --listen names an address.
func mcpOptions(c *cli.Context) (server.Options, error) {
	listen := c.String("listen")
	opts, err := runtimeOptions(c, listen == "", listen, server.JSONRPC)
	opts.MCP = true
	return opts, err
}
