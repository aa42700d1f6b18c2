package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
)

// usageFunc makes a usage error (exit status 2) of one command.
type usageFunc func(format string, args ...any) error

// usageOf is the usage error maker of command name: "name: … (see boxrt
// name --help)".
func usageOf(name string) usageFunc {
	return func(format string, args ...any) error {
		return &exitError{code: 2, msg: name + ": " + fmt.Sprintf(format, args...) + " (see boxrt " + name + " --help)"}
	}
}

// errShowHelp: --help came after the arguments, where urfave/cli does not
// look for it.
var errShowHelp = errors.New("help requested")

// argsAction is a command's action, given its positional arguments with
// every flag taken out of them.
type argsAction func(c *cli.Context, args []string) error

// flagsAnywhere makes action accept its flags before, between and after
// its arguments, as the README's and --help's examples write them
// ("boxrt cp SRC DST --url …"): urfave/cli stops parsing flags at the
// first argument, so the rest is parsed again with the command's own flag
// definitions and what it sets is set on c, where a later flag wins. After
// "--" everything is an argument, "--" included (boxrt exec's command).
func flagsAnywhere(name string, action argsAction) cli.ActionFunc {
	usage := usageOf(name)
	return func(c *cli.Context) error {
		args, err := lateFlags(c, usage)
		if errors.Is(err, errShowHelp) {
			return cli.ShowSubcommandHelp(c)
		}
		if err != nil {
			return err
		}
		return action(c, args)
	}
}

// noArgs is the action of a command that takes no arguments.
func noArgs(name string, action cli.ActionFunc) cli.ActionFunc {
	return flagsAnywhere(name, func(c *cli.Context, args []string) error {
		if len(args) > 0 {
			return usageOf(name)("takes no arguments, got %q", args)
		}
		return action(c)
	})
}

// setting is one flag given after an argument, as typed.
type setting struct{ name, value string }

// recorded passes a flag's values on and notes each one, so that it can be
// set on the command's context as typed (a slice flag's String is not).
type recorded struct {
	flag.Value
	name  string
	notes *[]setting
}

func (r recorded) Set(s string) error {
	if err := r.Value.Set(s); err != nil {
		return err
	}
	*r.notes = append(*r.notes, setting{r.name, s})
	return nil
}

// recordedBool keeps a bool flag usable without a value ("--spawn").
type recordedBool struct{ recorded }

func (recordedBool) IsBoolFlag() bool { return true }

// lateFlags parses the flags among c's arguments, sets them on c and
// returns the arguments.
func lateFlags(c *cli.Context, usage usageFunc) ([]string, error) {
	set := flag.NewFlagSet(c.Command.Name, flag.ContinueOnError)
	set.SetOutput(io.Discard)
	for _, f := range c.Command.Flags {
		if err := f.Apply(set); err != nil {
			return nil, err
		}
	}
	// urfave/cli adds its help flag to the command's flags; define it if
	// this version did not.
	if set.Lookup("help") == nil {
		set.Bool("help", false, "")
	}
	if set.Lookup("h") == nil {
		set.Var(set.Lookup("help").Value, "h", "")
	}
	var notes []setting
	set.VisitAll(func(f *flag.Flag) {
		r := recorded{Value: f.Value, name: f.Name, notes: &notes}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = recordedBool{r}
		} else {
			f.Value = r
		}
	})
	args, err := splitArgs(set, c.Args().Slice())
	if err != nil {
		return nil, usage("%v", err)
	}
	for _, n := range notes {
		if n.name == "help" || n.name == "h" {
			if n.value == "true" {
				return nil, errShowHelp
			}
			continue
		}
		if err := c.Set(n.name, n.value); err != nil {
			return nil, usage("--%s: %v", n.name, err)
		}
	}
	return args, nil
}

// splitArgs parses the flags of rest into set and returns the arguments;
// "--" ends the flags and is kept, with all that follows it.
func splitArgs(set *flag.FlagSet, rest []string) ([]string, error) {
	var args []string
	for len(rest) > 0 {
		if rest[0] == "--" {
			return append(args, rest...), nil
		}
		if err := set.Parse(rest); err != nil {
			return nil, err
		}
		consumed := rest[:len(rest)-set.NArg()]
		if len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			// flag.Parse dropped the "--" it stopped at.
			return append(append(args, "--"), set.Args()...), nil
		}
		if set.NArg() == 0 {
			break
		}
		args = append(args, set.Arg(0))
		rest = set.Args()[1:]
	}
	return args, nil
}
