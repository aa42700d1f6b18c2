package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/internal/controltoken"
	"github.com/boxrt/boxrt/reconnect"
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
		Name:            "boxrt",
		Usage:           "run AI-agent commands and MCP servers in isolated, reusable sandboxes",
		Description:     description(),
		Version:         buildVersion(version),
		HideHelpCommand: true,
		Commands: []*cli.Command{
			serveCommand(),
			mcpCommand(),
			boxCommand(),
			callCommand(),
			execCommand(),
			sessionsCommand(),
			cpCommand(),
			doctorCommand(),
			versionCommand(),
			agentCommand(),
		},
	}
}

// description is the top-level help; its quick start names this user's
// token file, so that its lines work as written.
func description() string {
	token := filepath.Join(reconnect.DefaultStateDir(), controltoken.FileName)
	return `boxrt is the sandbox runtime an AI-agent host spawns as a child process
(boxrt serve --stdio) or reaches over WebSocket (boxrt serve --listen ADDR).
It speaks JSON-RPC 2.0: box_exec runs a command in a session, sessions are
Docker containers or bubblewrap sandboxes that are created on first use,
reused, and reaped when idle. Managed processes (stdio MCP servers) are
reached through the WebSocket relay on the same listener.

Quick start (boxrt serve keeps running; the rest in another terminal):
  boxrt serve                      # WebSocket on 127.0.0.1:5410, token in ` + token + `
  boxrt exec s1 -- uname -a        # run a command in session s1 (created on first use)
  boxrt sessions                   # list the sessions
  boxrt call box_exec '{"session_id":"s1","cmd":"echo hi"}'
  npx wscat -c ws://127.0.0.1:5410/rpc/ws -H "Authorization: Bearer $(cat ` + token + `)"
  > {"jsonrpc":"2.0","id":1,"method":"__ping","params":{}}

Without a running runtime, --spawn starts a private one for one command:
  boxrt exec s1 --spawn -- echo hi

Protocol reference: docs/protocol.md`
}
