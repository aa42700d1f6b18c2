package sandboxagent

import (
	"fmt"
	"os"
)

// Main is the agent: `boxrt agent --connect PATH`. It dials PATH (again
// and again, with a backoff capped at 1 s, while the connection is down)
// and serves the host until it is killed. It returns only on a usage error
// (status 2).
func Main(args []string) int {
	fmt.Fprintln(os.Stderr, "boxrt agent: not implemented yet")
	return 2
}

// RunIfAgent lets a test binary act as the agent: called first in
// TestMain, when os.Args[1] is "agent" it runs Main(os.Args[2:]) and exits.
func RunIfAgent() {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		os.Exit(Main(os.Args[2:]))
	}
}
