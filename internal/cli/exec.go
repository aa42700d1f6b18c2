package cli

import (
	"context"
	"regexp"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/reconnect"
)

// Exit statuses of boxrt exec (and call --exit-code) besides the
// command's own.
const (
	exitTimedOut = 124 // as timeout(1)
	exitNotRun   = 125 // boxrt could not run the command to its end, as docker run's
)

func execCommand() *cli.Command {
	return &cli.Command{
		Name:      "exec",
		Usage:     "run a command in a session, stream its output and exit with its exit code",
		ArgsUsage: "SESSION -- CMD [ARGS…]",
		Description: `Runs CMD in SESSION (created on first use), as
  boxrt call box_exec '{"session_id":"SESSION","cmd":"CMD","stream":true}'
does, but prints the command's stdout and stderr on this process's stdout
and stderr as they arrive, and exits with the command's exit code: 124 if
it timed out, 125 if boxrt could not run it to its end (no runtime, a
refused spec, …: the error is on stderr), 2 for a usage error.

One word after "--" is a shell command line (sh -c in the sandbox: pipes,
$VARS and globs work there); several are a command and its arguments, each
quoted so that it arrives as given. Interrupting boxrt exec closes its
connection, which cancels the command. Flags may come anywhere before "--".

` + targetHelp + `

` + spawnHelp + `

Examples:
  boxrt exec s1 -- uname -a
  boxrt exec s1 -- 'cd /workspace && ls | wc -l'
  boxrt exec s1 --timeout 10m --env CI=1 -- sh /workspace/test.sh
  boxrt exec s1 --spawn -- cat /etc/os-release`,
		Flags: append(targetFlags(true),
			&cli.DurationFlag{Name: "timeout", DefaultText: "the runtime's", Usage: "kill the command after this long (box_exec's timeout_sec)"},
			&cli.StringFlag{Name: "workdir", Usage: "directory to run the command in (default: the session's)"},
			&cli.StringSliceFlag{Name: "env", Usage: "KEY=VALUE in the command's environment (repeat the flag for more)"},
		),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageOf("exec")("%v", err) },
		Action:       flagsAnywhere("exec", runExec),
	}
}

// execRequest reads box_exec's params from exec's arguments and flags.
func execRequest(c *cli.Context, args []string) (reconnect.ExecSpec, error) {
	usage := usageOf("exec")
	if len(args) > 1 && args[1] == "--" {
		args = append(args[:1:1], args[2:]...)
	}
	if len(args) < 2 {
		return reconnect.ExecSpec{}, usage("want SESSION -- CMD [ARGS…], got %q", args)
	}
	spec := reconnect.ExecSpec{SessionID: args[0], Cmd: shellLine(args[1:]), Workdir: c.String("workdir")}
	if d := c.Duration("timeout"); d != 0 {
		if d < time.Second {
			return spec, usage("--timeout must be at least 1s, got %v", d)
		}
		spec.TimeoutSec = int(d.Round(time.Second) / time.Second)
	}
	for _, kv := range c.StringSlice("env") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return spec, usage("--env wants KEY=VALUE, got %q", kv)
		}
		if spec.Env == nil {
			spec.Env = map[string]string{}
		}
		spec.Env[k] = v
	}
	return spec, nil
}

func runExec(c *cli.Context, args []string) error {
	spec, err := execRequest(c, args)
	if err != nil {
		return err
	}
	t, err := readTarget(c, usageOf("exec"))
	if err != nil {
		return err
	}
	ctx := c.Context
	if spec.TimeoutSec > 0 {
		// The runtime ends the command at its timeout; this only bounds a
		// runtime that stops answering.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(spec.TimeoutSec)*time.Second+connectTimeout+30*time.Second)
		defer cancel()
	}
	client, err := t.connect(ctx, c.App.ErrWriter)
	var res reconnect.ExecResult
	if err == nil {
		res, err = client.ExecStream(ctx, spec, func(o reconnect.ExecOutput) {
			if o.Stream == "stderr" {
				_, _ = c.App.ErrWriter.Write(o.Data)
			} else {
				_, _ = c.App.Writer.Write(o.Data)
			}
		})
		_ = client.Close()
	}
	if err != nil {
		t.showLog(c.App.ErrWriter, "exec")
		return &exitError{code: exitNotRun, msg: "exec: " + err.Error()}
	}
	if code, _ := commandExit(res.Status, res.ExitCode); code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// shellSafe are the words a shell reads as themselves.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellLine is box_exec's cmd for exec's words: one word is a command line
// already; several are quoted, each to arrive as one argument.
func shellLine(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	quoted := make([]string, len(words))
	for i, w := range words {
		if shellSafe.MatchString(w) {
			quoted[i] = w
		} else {
			quoted[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
	}
	return strings.Join(quoted, " ")
}
