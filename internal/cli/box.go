package cli

import (
	"net"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/internal/server"
)

// boxCommand is the reference's launcher, `lbp box [-s] [--host H]
// [--ws-control-port N]`, as a drop-in for the unchanged LangBot host: it
// runs serve with LangBot's action-RPC envelope, tenancy contexts required
// and the host's headers on /rpc/ws and the relay.
func boxCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.BoolFlag{Name: "stdio-control", Aliases: []string{"s"}, Usage: "serve the action RPC on stdin/stdout (LANGBOT_BOX_TRUSTED_INSTANCE_UUID required)"},
		&cli.StringFlag{Name: "host", Value: "0.0.0.0", Usage: "address /rpc/ws, the relay and health listen on (a non-loopback one needs LANGBOT_BOX_CONTROL_TOKEN)"},
		&cli.IntFlag{Name: "ws-control-port", Value: 5410, Usage: "port of /rpc/ws, the relay and health (also in -s mode, for the relay)"},
	}
	for _, f := range serveCommand().Flags {
		switch f.Names()[0] {
		case "stdio", "listen", "protocol":
			// Set from the flags above.
			flags = append(flags, hidden(f))
		default:
			flags = append(flags, f)
		}
	}
	return &cli.Command{
		Name:  "box",
		Usage: "run as a drop-in LangBot Box runtime (LangBot's action-RPC envelope and tenancy)",
		Description: `Starts boxrt the way LangBot starts its Box runtime (lbp box): the
same flags, the same environment (LANGBOT_BOX_CONFIG,
LANGBOT_BOX_CONTROL_TOKEN, LANGBOT_BOX_TRUSTED_INSTANCE_UUID) and the same
wire: LangBot's action-RPC envelope on stdio (-s) or ws://HOST:PORT/rpc/ws,
tenant contexts required, sessions namespaced per Workspace placement, the
generation fence, and the relay at /v1/sessions/{physical id}/managed-process/…
with the X-LangBot-* headers. It is "boxrt serve --protocol langbot" with
these flags; docs/operations.md shows how to point LangBot at it.`,
		Flags: flags,
		Action: noArgs("box", func(c *cli.Context) error {
			stdio := c.Bool("stdio-control")
			listen := net.JoinHostPort(c.String("host"), strconv.Itoa(c.Int("ws-control-port")))
			for name, value := range map[string]string{"stdio": strconv.FormatBool(stdio), "listen": listen, "protocol": string(server.LangBot)} {
				if err := c.Set(name, value); err != nil {
					return err
				}
			}
			return runServe(c)
		}),
	}
}

// hidden returns f left out of box's help: box sets it from its own
// flags.
func hidden(f cli.Flag) cli.Flag {
	switch t := f.(type) {
	case *cli.BoolFlag:
		c := *t
		c.Hidden = true
		return &c
	case *cli.StringFlag:
		c := *t
		c.Hidden = true
		return &c
	}
	return f
}
