// Command boxrt is a sandbox runtime for AI-agent hosts: it runs shell
// commands and stdio MCP servers in isolated, reusable sessions (Docker
// containers or bubblewrap sandboxes) and speaks JSON-RPC 2.0 over stdio or
// WebSocket.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/internal/fdsafe"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// exitError carries a process exit status with a message for stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func newApp() *cli.App {
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
		Version:         buildVersion(),
		HideHelpCommand: true,
		Commands: []*cli.Command{
			serveCommand(),
			boxCommand(),
			callCommand(),
			cpCommand(),
			doctorCommand(),
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(c *cli.Context) error {
					fmt.Fprintln(c.App.Writer, buildVersion())
					return nil
				},
			},
		},
	}
}

func main() {
	// First, before anything can start a child: a descriptor the parent
	// leaked to boxrt must not reach bwrap or a sandbox.
	if err := fdsafe.Seal(); err != nil {
		fmt.Fprintln(os.Stderr, "boxrt: "+err.Error())
		os.Exit(1)
	}
	err := newApp().Run(os.Args)
	if err == nil {
		return
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(os.Stderr, "boxrt: "+ee.msg)
		}
		os.Exit(ee.code)
	}
	fmt.Fprintln(os.Stderr, "boxrt: "+err.Error())
	os.Exit(1)
}
