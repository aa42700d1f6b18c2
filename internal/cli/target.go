package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/reconnect"
)

// defaultURL is where `boxrt serve` listens unless told otherwise, so the
// client commands reach a local runtime without --url.
const defaultURL = "ws://127.0.0.1:5410"

// connectTimeout bounds reaching the runtime, separately from the call:
// a client command should say "cannot connect" in seconds, not after a
// two-minute --timeout meant for a long box_exec.
const connectTimeout = 10 * time.Second

// targetHelp says how the client commands find the runtime and its token;
// their help texts include it.
const targetHelp = `The runtime is the one at --url (ws, wss, http or https; the path defaults
to /rpc/ws; default ` + defaultURL + `, where "boxrt serve" listens). The
control token comes from --token-file, else BOXRT_CONTROL_TOKEN (or
LANGBOT_BOX_CONTROL_TOKEN), else, for a loopback --url, the token a local
"boxrt serve" generated in STATE_DIR/control-token (--state-dir, the same
default as serve's); it is sent only as "Authorization: Bearer …".`

// spawnHelp says what --spawn does, for the commands that have it.
const spawnHelp = `Or start a private runtime with --spawn: this executable runs
"serve --stdio --listen ''" (or --spawn-cmd) for the one command and is
shut down afterwards. It gets a private, temporary state directory,
removed when it exits, and its sessions end with it: it never touches the
sessions of a runtime serving on this machine. With --state-dir DIR it uses
DIR instead (and refuses if a runtime holds DIR). Its log is shown only if
the command fails, or always with --verbose.`

// targetFlags are the flags that say which runtime a client command
// reaches and with what token; with spawn, also those that start one.
func targetFlags(spawn bool) []cli.Flag {
	stateDir := "state directory of the local runtime whose generated control token to use"
	if spawn {
		stateDir += "; with --spawn, the spawned runtime's (default: a private temporary one)"
	}
	flags := []cli.Flag{
		&cli.StringFlag{Name: "url", Value: defaultURL, Usage: "runtime URL to dial (ws, wss, http or https)"},
		&cli.StringFlag{Name: "token-file", Usage: "read the control token from this file (default: $BOXRT_CONTROL_TOKEN, else for a loopback --url STATE_DIR/control-token)"},
		&cli.StringFlag{Name: "state-dir", Value: reconnect.DefaultStateDir(), Usage: stateDir},
	}
	if spawn {
		flags = append(flags,
			&cli.BoolFlag{Name: "spawn", Usage: "spawn a runtime for this command: this executable with serve --stdio --listen ''"},
			&cli.StringFlag{Name: "spawn-cmd", Usage: "command line to spawn instead (implies --spawn); quotes work as in a shell"},
			&cli.BoolFlag{Name: "verbose", Usage: "with --spawn, show the runtime's log on stderr as it runs"},
		)
	}
	return flags
}

// target is the runtime a client command reaches: dialed at url with
// token, or spawned with spawnCmd.
type target struct {
	url    string
	urlSet bool
	token  string
	// spawnCmd is nil to dial.
	spawnCmd []string
	// stateDir is the spawned runtime's state directory when --state-dir
	// names one; "" gives it a private one.
	stateDir string
	verbose  bool
	childLog *cappedBuffer
}

// readTarget reads targetFlags.
func readTarget(c *cli.Context, usage usageFunc) (*target, error) {
	t := &target{url: c.String("url"), urlSet: c.IsSet("url"), verbose: c.Bool("verbose"), childLog: &cappedBuffer{max: 256 << 10}}
	var err error
	if t.spawnCmd, err = spawnCommand(c, usage); err != nil {
		return nil, err
	}
	if t.spawnCmd != nil {
		if t.urlSet {
			return nil, usage("use either --url or --spawn, not both")
		}
		if c.IsSet("state-dir") {
			t.stateDir = c.String("state-dir")
		}
		return t, nil
	}
	if t.token, err = clientToken(c.String("token-file"), c.String("state-dir"), t.url, usage); err != nil {
		return nil, err
	}
	return t, nil
}

// spawnCommand is the command line --spawn-cmd or --spawn runs; nil to
// dial (and for the commands without those flags).
func spawnCommand(c *cli.Context, usage usageFunc) ([]string, error) {
	if sc := c.String("spawn-cmd"); sc != "" {
		words, err := splitCommandLine(sc)
		if err != nil {
			return nil, usage("--spawn-cmd: %v", err)
		}
		if len(words) == 0 {
			return nil, usage("--spawn-cmd is empty")
		}
		return words, nil
	}
	if !c.Bool("spawn") {
		return nil, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find this executable to spawn: %w", err)
	}
	return []string{self, "serve", "--stdio", "--listen", ""}, nil
}

// clientToken finds the control token a client command sends: --token-file,
// else BOXRT_CONTROL_TOKEN (or LANGBOT_BOX_CONTROL_TOKEN), else, for a
// loopback runtimeURL, the token a local serve generated in stateDir.
func clientToken(tokenFile, stateDir, runtimeURL string, usage usageFunc) (string, error) {
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return "", usage("--token-file: %v", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", usage("--token-file %s is empty", tokenFile)
		}
		return tok, nil
	}
	tok, err := reconnect.DiscoverToken(runtimeURL, stateDir)
	if err != nil {
		return "", usage("%v (pass --token-file or BOXRT_CONTROL_TOKEN)", err)
	}
	return tok, nil
}

// connect reaches the runtime within ctx, giving up on the first failed
// attempt or after connectTimeout: a typo in --url should not sit through
// the reconnect backoff. A spawned runtime's log goes to errOut with
// --verbose, else into t.childLog.
func (t *target) connect(ctx context.Context, errOut io.Writer) (*reconnect.Client, error) {
	connectCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(connectTimeout, func() {
		cancel(fmt.Errorf("no connection within %v", connectTimeout))
	})
	defer timer.Stop()
	opts := []reconnect.Option{
		reconnect.WithOnStateChange(func(s reconnect.State, _ error) {
			if s == reconnect.StateConnectFailed {
				cancel(errors.New("gave up after the first failed attempt"))
			}
		}),
	}
	if t.spawnCmd != nil {
		var stderr io.Writer = t.childLog
		if t.verbose {
			stderr = errOut
		}
		opts = append(opts, reconnect.WithCommand(t.spawnCmd[0], t.spawnCmd[1:]...), reconnect.WithStderr(stderr))
		if t.stateDir != "" {
			opts = append(opts, reconnect.WithStateDir(t.stateDir))
		}
		return reconnect.Spawn(connectCtx, opts...)
	}
	client, err := reconnect.Dial(connectCtx, t.url, append(opts, reconnect.WithToken(t.token))...)
	// Retryable: nothing answered (a refused token is not).
	var e *reconnect.Error
	if err != nil && !t.urlSet && errors.As(err, &e) && e.Retryable {
		hinted := *e
		hinted.Message += fmt.Sprintf(" (nothing answers at the default --url %s: start the runtime with boxrt serve or scripts/run, or pass --url or --spawn)", t.url)
		return nil, &hinted
	}
	return client, err
}

// showLog prints a spawned runtime's log after a failure, unless
// --verbose printed it already.
func (t *target) showLog(errOut io.Writer, cmd string) {
	if t.spawnCmd != nil && !t.verbose && t.childLog.Len() > 0 {
		fmt.Fprintf(errOut, "boxrt %s: the spawned runtime's log:\n%s\n", cmd, t.childLog.String())
	}
}

// splitCommandLine splits s into words as a POSIX shell would for simple
// cases: whitespace separates, '…' is literal, "…" honours \" and \\, and
// a backslash outside quotes escapes the next character. No expansion.
func splitCommandLine(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == ' ' || ch == '\t' || ch == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case ch == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case ch == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New("unterminated double quote")
			}
			inWord = true
		case ch == '\\':
			if i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			}
			inWord = true
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// cappedBuffer keeps the last max bytes of a child's log.
type cappedBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *cappedBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.buf)
}

func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimRight(string(b.buf), "\n")
}
