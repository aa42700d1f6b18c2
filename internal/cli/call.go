package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/reconnect"
)

// callConnectTimeout bounds reaching the runtime, separately from the call:
// a debugging command should say "cannot connect" in seconds, not after a
// two-minute --timeout meant for a long box_exec.
const callConnectTimeout = 10 * time.Second

func callCommand() *cli.Command {
	return &cli.Command{
		Name:      "call",
		Usage:     "send one JSON-RPC request to a runtime and print the answer",
		ArgsUsage: "METHOD [PARAMS_JSON|-]",
		Description: `Sends one request, the way a host would, and prints the result as indented
JSON on stdout (exit status 0). A failure is printed on stdout as
  {"error": {"code", "type", "message", "retryable", "data"}}
with exit status 1, so scripts can read error.type (BoxSessionNotFoundError,
…). Usage errors exit with 2. PARAMS_JSON is a JSON object or array (default
{}); "-" reads it from stdin. Flags may come before or after the arguments.

Reach a running runtime with --url (ws, wss, http or https; the path
defaults to /rpc/ws). The control token comes from --token-file, else
BOXRT_CONTROL_TOKEN (or LANGBOT_BOX_CONTROL_TOKEN), else, for a loopback
--url, the token a local "boxrt serve" generated in STATE_DIR/control-token
(--state-dir, the same default as serve's); it is sent only as
"Authorization: Bearer …". Or start a private runtime with --spawn: this
executable runs "serve --stdio --listen ''" (or --spawn-cmd) for the one
call and is shut down afterwards. It gets a private, temporary state
directory, removed when it exits, and its sessions end with it: it never
touches the sessions of a runtime serving on this machine. With
--state-dir DIR it uses DIR instead (and refuses if a runtime holds DIR).
Its log is shown only if the call fails, or always with --verbose.

Examples:
  boxrt call __ping --url ws://127.0.0.1:5410
  boxrt call box_get_backend_info --url https://box.internal:5410 --token-file /run/secrets/boxrt
  boxrt call box_exec '{"session_id":"s1","cmd":"uname -a"}' --spawn
  echo '{"session_id":"s1"}' | boxrt call box_get_session - --url ws://127.0.0.1:5410
  boxrt call box_get_sessions --spawn-cmd 'boxrt serve --stdio --listen "" --config /etc/boxrt.yaml'
  boxrt call box_get_session '{"session_id":"nope"}' --url ws://127.0.0.1:5410 | jq -r .error.type

Streaming: when PARAMS_JSON asks for "stream": true (box_exec,
box_exec_start) or the method is box_exec_attach, the command's output is
printed on stderr as it arrives (--stream-format raw: the bytes as the
command wrote them, both streams; jsonl: one box_exec_output per line, for
tools), while stdout still gets only the result. For box_exec_start and
box_exec_attach the call then keeps following the output until the exec
ends (or --timeout); interrupting boxrt call closes its connection, which
cancels a streamed box_exec (status canceled) but leaves a background exec
running.
  boxrt call box_exec '{"session_id":"s1","cmd":"make test","stream":true}' --url ws://127.0.0.1:5410
  boxrt call box_exec_attach '{"exec_id":"x-…"}' --url ws://127.0.0.1:5410 --stream-format jsonl 2>&1 >/dev/null | jq .`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", Usage: "runtime URL to dial, e.g. ws://127.0.0.1:5410"},
			&cli.StringFlag{Name: "token-file", Usage: "read the control token from this file (default: $BOXRT_CONTROL_TOKEN, else for a loopback --url STATE_DIR/control-token)"},
			&cli.StringFlag{Name: "state-dir", Value: reconnect.DefaultStateDir(), Usage: "state directory of the local runtime whose generated control token to use; with --spawn, the spawned runtime's (default: a private temporary one)"},
			&cli.BoolFlag{Name: "spawn", Usage: "spawn a runtime for this call: this executable with serve --stdio --listen ''"},
			&cli.StringFlag{Name: "spawn-cmd", Usage: "command line to spawn instead (implies --spawn); quotes work as in a shell"},
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "give up on the call after this long (reaching the runtime: at most 10s of it)"},
			&cli.BoolFlag{Name: "verbose", Usage: "with --spawn, show the runtime's log on stderr as it runs"},
			&cli.StringFlag{Name: "stream-format", Value: "raw", Usage: "how streamed exec output is printed on stderr: raw or jsonl"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return &exitError{code: 2, msg: "call: " + err.Error() + " (see boxrt call --help)"}
		},
		Action: runCall,
	}
}

type callArgs struct {
	method   string
	params   json.RawMessage
	url      string
	token    string
	spawnCmd []string // nil: dial
	// stateDir is the spawned runtime's state directory when --state-dir
	// names one; "" gives it a private one.
	stateDir string
	timeout  time.Duration
	verbose  bool
	// streamFormat is "raw" or "jsonl"; stream says the call streams.
	streamFormat string
	stream       bool
}

func usageErr(format string, args ...any) error {
	return &exitError{code: 2, msg: "call: " + fmt.Sprintf(format, args...) + " (see boxrt call --help)"}
}

// parseCallArgs reads the request, where to send it and how, checking
// each in the order the usage errors are reported.
func parseCallArgs(c *cli.Context, stdin io.Reader) (*callArgs, error) {
	flags, pos, err := parseCallFlags(c)
	if err != nil {
		return nil, err
	}
	a := &callArgs{url: flags.str("url"), verbose: flags.boolean("verbose")}
	if a.timeout, err = flags.duration("timeout"); err != nil {
		return nil, usageErr("--timeout: %v", err)
	}
	if a.timeout <= 0 {
		return nil, usageErr("--timeout must be positive")
	}
	if a.method, a.params, err = callRequest(pos, stdin); err != nil {
		return nil, err
	}
	a.streamFormat = flags.str("stream-format")
	if a.streamFormat != "raw" && a.streamFormat != "jsonl" {
		return nil, usageErr("--stream-format must be raw or jsonl, got %q", a.streamFormat)
	}
	a.stream = streams(a.method, a.params)
	if a.spawnCmd, err = spawnCommand(flags); err != nil {
		return nil, err
	}
	switch {
	case a.spawnCmd != nil && a.url != "":
		return nil, usageErr("use either --url or --spawn, not both")
	case a.spawnCmd == nil && a.url == "":
		return nil, usageErr("say where the runtime is: --url URL, or --spawn")
	}
	if flags.isSet("state-dir") {
		a.stateDir = flags.str("state-dir")
	}
	if a.token, err = clientToken(flags.str("token-file"), flags.str("state-dir"), a.url, usageErr); err != nil {
		return nil, err
	}
	return a, nil
}

// callFlags are call's flags wherever they were given: urfave/cli stops
// parsing flags at the first argument ("boxrt call __ping --url …"), so
// the rest is parsed again with the same flag definitions, and a flag
// found there wins.
type callFlags struct {
	c    *cli.Context
	set  *flag.FlagSet
	late map[string]bool
}

// parseCallFlags parses the flags that follow the arguments and returns
// the arguments.
func parseCallFlags(c *cli.Context) (callFlags, []string, error) {
	set := flag.NewFlagSet("call", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	for _, f := range c.Command.Flags {
		if err := f.Apply(set); err != nil {
			return callFlags{}, nil, err
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
	var pos []string
	rest := c.Args().Slice()
	for len(rest) > 0 {
		if err := set.Parse(rest); err != nil {
			return callFlags{}, nil, usageErr("%v", err)
		}
		if set.NArg() == 0 {
			break
		}
		pos = append(pos, set.Arg(0))
		rest = set.Args()[1:]
	}
	if set.Lookup("help").Value.String() == "true" {
		return callFlags{}, nil, errShowHelp
	}
	late := map[string]bool{}
	set.Visit(func(f *flag.Flag) { late[f.Name] = true })
	return callFlags{c: c, set: set, late: late}, pos, nil
}

func (f callFlags) str(name string) string {
	if f.late[name] {
		return f.set.Lookup(name).Value.String()
	}
	return f.c.String(name)
}

func (f callFlags) boolean(name string) bool {
	if f.late[name] {
		return f.set.Lookup(name).Value.String() == "true"
	}
	return f.c.Bool(name)
}

func (f callFlags) duration(name string) (time.Duration, error) {
	if f.late[name] {
		return time.ParseDuration(f.set.Lookup(name).Value.String())
	}
	return f.c.Duration(name), nil
}

func (f callFlags) isSet(name string) bool {
	return f.late[name] || f.c.IsSet(name)
}

// callRequest reads METHOD and PARAMS_JSON ("-": from stdin; default {}).
func callRequest(pos []string, stdin io.Reader) (string, json.RawMessage, error) {
	switch len(pos) {
	case 0:
		return "", nil, usageErr("missing METHOD")
	case 1:
		return pos[0], json.RawMessage("{}"), nil
	case 2:
	default:
		return "", nil, usageErr("too many arguments: %q (quote PARAMS_JSON as one argument)", pos[2:])
	}
	raw := []byte(pos[1])
	if pos[1] == "-" {
		b, err := io.ReadAll(io.LimitReader(stdin, reconnect.MaxMessageBytes+1))
		if err != nil {
			return "", nil, usageErr("reading PARAMS_JSON from stdin: %v", err)
		}
		raw = b
	}
	raw = bytes.TrimSpace(raw)
	if !json.Valid(raw) {
		return "", nil, usageErr("PARAMS_JSON is not valid JSON: %.80q", raw)
	}
	if len(raw) == 0 || (raw[0] != '{' && raw[0] != '[') {
		return "", nil, usageErr("PARAMS_JSON must be a JSON object or array (JSON-RPC params), got %.40s", raw)
	}
	return pos[0], raw, nil
}

// spawnCommand is the command line --spawn-cmd or --spawn runs; nil to
// dial.
func spawnCommand(flags callFlags) ([]string, error) {
	if sc := flags.str("spawn-cmd"); sc != "" {
		words, err := splitCommandLine(sc)
		if err != nil {
			return nil, usageErr("--spawn-cmd: %v", err)
		}
		if len(words) == 0 {
			return nil, usageErr("--spawn-cmd is empty")
		}
		return words, nil
	}
	if !flags.boolean("spawn") {
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
func clientToken(tokenFile, stateDir, runtimeURL string, usage func(string, ...any) error) (string, error) {
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

// errShowHelp: --help came after the arguments, where urfave/cli does not
// look for it.
var errShowHelp = errors.New("help requested")

func runCall(c *cli.Context) error {
	a, err := parseCallArgs(c, os.Stdin)
	if errors.Is(err, errShowHelp) {
		return cli.ShowSubcommandHelp(c)
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context, a.timeout)
	defer cancel()

	// Fail fast on the first connection failure: a typo in --url should
	// not sit through the reconnect backoff.
	connectCtx, cancelConnect := context.WithCancelCause(ctx)
	defer cancelConnect(nil)
	timer := time.AfterFunc(callConnectTimeout, func() {
		cancelConnect(fmt.Errorf("no connection within %v", callConnectTimeout))
	})
	defer timer.Stop()
	opts := []reconnect.Option{
		reconnect.WithOnStateChange(func(s reconnect.State, _ error) {
			if s == reconnect.StateConnectFailed {
				cancelConnect(errors.New("gave up after the first failed attempt"))
			}
		}),
	}

	var client *reconnect.Client
	childLog := &cappedBuffer{max: 256 << 10}
	if a.spawnCmd != nil {
		var stderr io.Writer = childLog
		if a.verbose {
			stderr = c.App.ErrWriter
		}
		opts = append(opts, reconnect.WithCommand(a.spawnCmd[0], a.spawnCmd[1:]...), reconnect.WithStderr(stderr))
		if a.stateDir != "" {
			opts = append(opts, reconnect.WithStateDir(a.stateDir))
		}
		client, err = reconnect.Spawn(connectCtx, opts...)
	} else {
		opts = append(opts, reconnect.WithToken(a.token))
		client, err = reconnect.Dial(connectCtx, a.url, opts...)
	}
	var result json.RawMessage
	if err == nil {
		if a.stream {
			err = callStreaming(ctx, client, a, c.App.Writer, c.App.ErrWriter)
		} else {
			err = client.Call(ctx, a.method, a.params, &result)
		}
		// Close before printing: in spawn mode it waits for the child's
		// shutdown, whose log belongs before our verdict.
		_ = client.Close()
	}
	if err != nil {
		if a.spawnCmd != nil && !a.verbose && childLog.Len() > 0 {
			fmt.Fprintf(c.App.ErrWriter, "boxrt call: the spawned runtime's log:\n%s\n", childLog.String())
		}
		writeIndented(c.App.Writer, callErrorJSON(err, a.timeout))
		return &exitError{code: 1}
	}
	if !a.stream {
		writeIndented(c.App.Writer, result)
	}
	return nil
}

// streams reports whether a call streams exec output to its connection.
func streams(method string, params json.RawMessage) bool {
	if method == "box_exec_attach" {
		return true
	}
	var p struct {
		Stream bool `json:"stream"`
	}
	return (method == "box_exec" || method == "box_exec_start") && json.Unmarshal(params, &p) == nil && p.Stream
}

// callStreaming makes a streaming call: the output goes to errOut as it
// arrives, the result to out (for box_exec after the output, which ends
// before it; for box_exec_start and box_exec_attach at once, then the
// output is followed to its end).
func callStreaming(ctx context.Context, client *reconnect.Client, a *callArgs, out, errOut io.Writer) error {
	ended := make(chan reconnect.ExecOutput, 1)
	var result json.RawMessage
	err := client.CallStream(ctx, a.method, a.params, &result, func(o reconnect.ExecOutput) {
		printOutput(errOut, a.streamFormat, o)
		if o.EOF || o.Err != nil {
			ended <- o
		}
	})
	if err != nil {
		return err
	}
	writeIndented(out, result)
	select {
	case o := <-ended:
		return o.Err
	case <-ctx.Done():
		return fmt.Errorf("following the exec's output: %w", context.Cause(ctx))
	}
}

// printOutput prints one chunk: raw bytes, or a JSON line.
func printOutput(w io.Writer, format string, o reconnect.ExecOutput) {
	if format == "raw" {
		if len(o.Data) > 0 {
			_, _ = w.Write(o.Data)
		}
		return
	}
	line := map[string]any{"exec_id": o.ExecID, "seq": o.Seq}
	switch {
	case o.Err != nil:
		line = map[string]any{"error": o.Err.Error()}
	case o.EOF:
		line["eof"] = true
	case utf8.Valid(o.Data):
		line["stream"], line["data"] = o.Stream, string(o.Data)
	default:
		line["stream"], line["data_base64"] = o.Stream, base64.StdEncoding.EncodeToString(o.Data)
	}
	b, _ := json.Marshal(line)
	_, _ = w.Write(append(b, '\n'))
}

// callErrorJSON renders err as {"error":{…}}: a typed *reconnect.Error as
// is; anything else (a timed-out call) as the BoxRuntimeUnavailableError a
// host would treat it as.
func callErrorJSON(err error, timeout time.Duration) []byte {
	type wireError struct {
		Code      int64           `json:"code"`
		Type      string          `json:"type"`
		Message   string          `json:"message"`
		Retryable bool            `json:"retryable"`
		Data      json.RawMessage `json:"data"`
	}
	var out wireError
	var e *reconnect.Error
	if errors.As(err, &e) {
		out = wireError{Code: e.Code, Type: e.Type, Message: e.Error(), Retryable: e.Retryable, Data: e.Data}
	} else {
		msg := err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			msg = fmt.Sprintf("no answer within --timeout %v: %v", timeout, err)
		}
		out = wireError{Code: reconnect.ErrRuntimeUnavailable.Code, Type: reconnect.ErrRuntimeUnavailable.Type,
			Message: "BoxRuntimeUnavailableError: " + msg, Retryable: true}
	}
	if len(out.Data) == 0 {
		out.Data = json.RawMessage("null")
	}
	b, _ := json.Marshal(map[string]wireError{"error": out})
	return b
}

func writeIndented(w io.Writer, raw []byte) {
	if len(raw) == 0 {
		raw = []byte("null")
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		buf.Reset()
		buf.Write(raw)
	}
	buf.WriteByte('\n')
	_, _ = w.Write(buf.Bytes())
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
