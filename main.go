// Command boxrt is a sandbox runtime for AI-agent hosts: it runs shell
// commands and stdio MCP servers in isolated, reusable sessions (Docker
// containers or bubblewrap sandboxes) and speaks JSON-RPC 2.0 over stdio or
// WebSocket.
package main

import (
	"fmt"
	"os"

	"github.com/boxrt/boxrt/internal/cli"
	"github.com/boxrt/boxrt/internal/fdsafe"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func main() {
	// First, before anything can start a child: a descriptor the parent
	// leaked to boxrt must not reach bwrap or a sandbox.
	if err := fdsafe.Seal(); err != nil {
		fmt.Fprintln(os.Stderr, "boxrt: "+err.Error())
		os.Exit(1)
	}
	os.Exit(cli.Main(version, os.Args))
}
