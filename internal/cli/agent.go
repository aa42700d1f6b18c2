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
It does not start anything on its own and runs until it is killed.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "connect", Usage: "the agent socket to dial, as seen inside the sandbox"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageOf("agent")("%v", err) },
		Action: noArgs("agent", func(c *cli.Context) error {
			if c.String("connect") == "" {
				return usageOf("agent")("--connect PATH is required")
			}
			if code := sandboxagent.Main([]string{"--connect", c.String("connect")}); code != 0 {
				return &exitError{code: code}
			}
			return nil
		}),
	}
}
