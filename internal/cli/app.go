package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// exitError carries a process exit status with a message for stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// Main runs the boxrt command line args and returns the exit status: 0,
// 1 for a failure, 2 for a usage or configuration error. A message goes to
// stderr as "boxrt: …". version is the one set at build time, "" if none.
func Main(version string, args []string) int {
	err := newApp(version).Run(args)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(os.Stderr, "boxrt: "+ee.msg)
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "boxrt: "+err.Error())
	return 1
}

func newApp(version string) *cli.App {
	return &cli.App{
		Name:  "boxrt",
		Usage: "run AI-agent commands and MCP servers in isolated, reusable sandboxes",
		Description: `boxrt is the sandbox runtime an AI-agent host spawns as a child process
(boxrt serve --stdio) or reaches over WebSocket (boxrt serve --listen ADDR).
It speaks JSON-RPC 2.0: box_exec runs a command in a session, sessions are
Docker containers or bubblewrap sandboxes that are created on first use,
reused, and reaped when idle. Managed processes (stdio MCP servers) are
reached through the WebSocket relay on the same listener.

Quick start:
  boxrt serve                      # WebSocket on 127.0.0.1:5410
  npx wscat -c ws://127.0.0.1:5410/rpc/ws
  > {"jsonrpc":"2.0","id":1,"method":"__ping","params":{}}

  boxrt call box_exec '{"session_id":"s1","cmd":"echo hi"}' --spawn

Protocol reference: docs/protocol.md`,
		Version:         buildVersion(version),
		HideHelpCommand: true,
		Commands: []*cli.Command{
			serveCommand(),
			boxCommand(),
			callCommand(),
			cpCommand(),
			doctorCommand(),
			versionCommand(),
		},
	}
}
