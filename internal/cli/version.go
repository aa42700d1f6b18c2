package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

// buildVersion is the version set at build time, else the module's
// (go install …@v1.2.3), else "dev".
func buildVersion(set string) string {
	if set != "" {
		return set
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: noArgs("version", func(c *cli.Context) error {
			fmt.Fprintln(c.App.Writer, c.App.Version)
			return nil
		}),
	}
}
