package cli

import (
	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// agentCommand is the session agent, the PID 1 boxrt starts inside a
// sandbox. It is hidden from boxrt --help: nobody runs it by hand.
func agentCommand() *cli.Command {
	return &cli.Command{
		Name:   "agent",
		Usage:  "the session agent boxrt runs inside a sandbox (not run by hand)",
		Hidden: true,
		Description: `boxrt agent is run by boxrt itself, as the first process inside a session's
sandbox: it dials the socket boxrt listens on (re-dialing while the
connection is down), starts the session's commands inside the sandbox with
the pipes or pty boxrt passes it, signals them and reports their exits.
It does not start anything on its own and runs until it is killed.
In a Kubernetes Pod it listens instead (--listen), and boxrt reaches it
through an exec of "boxrt agent --bridge", whose stdin and stdout carry
the protocol.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "connect", Usage: "the agent socket to dial, as seen inside the sandbox"},
			&cli.StringFlag{Name: "listen", Usage: "the socket to listen on inside the sandbox (a Pod's agent)"},
			&cli.StringFlag{Name: "bridge", Usage: "join stdin and stdout to the listening agent's socket"},
			&cli.BoolFlag{Name: "version", Usage: "print the agent protocol's version"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageOf("agent")("%v", err) },
		Action: noArgs("agent", func(c *cli.Context) error {
			var args []string
			for _, name := range []string{"connect", "listen", "bridge"} {
				if c.String(name) != "" {
					args = append(args, "--"+name, c.String(name))
				}
			}
			if c.Bool("version") {
				args = append(args, "--version")
			}
			if len(args) == 0 {
				return usageOf("agent")("--connect PATH, --listen PATH, --bridge PATH or --version is required")
			}
			if code := sandboxagent.Main(args); code != 0 {
				return &exitError{code: code}
			}
			return nil
		}),
	}
}
