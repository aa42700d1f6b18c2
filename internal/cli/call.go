package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/reconnect"
)

func callCommand() *cli.Command {
	return &cli.Command{
		Name:      "call",
		Usage:     "send one JSON-RPC request to a runtime and print the answer",
		ArgsUsage: "METHOD [PARAMS_JSON|-]",
		Description: `Sends one request, the way a host would, and prints the result as indented
JSON on stdout (exit status 0). A failure is printed on stdout as
  {"error": {"code", "type", "message", "retryable", "data"}}
with exit status 1, so scripts can read error.type (BoxSessionNotFoundError,
…); data holds the error's details (field, limit, …) or null. Usage errors
exit with 2. PARAMS_JSON is a JSON object or array (default {}); "-" reads
it from stdin. Flags may come before or after the arguments.

With --exit-code, a command's result (box_exec, box_exec_wait) sets the
exit status: the command's exit code, 124 if it timed out, 125 if it ended
otherwise (canceled); a failed call still exits with 1.

` + targetHelp + `

` + spawnHelp + `

Examples:
  boxrt call __ping
  boxrt call box_get_backend_info --url https://box.internal:5410 --token-file /run/secrets/boxrt
  boxrt call box_exec '{"session_id":"s1","cmd":"uname -a"}' --spawn
  echo '{"session_id":"s1"}' | boxrt call box_get_session - --url ws://127.0.0.1:5410
  boxrt call box_get_sessions --spawn-cmd 'boxrt serve --stdio --listen "" --config /etc/boxrt.yaml'
  boxrt call box_get_session '{"session_id":"nope"}' | jq -r .error.type
  boxrt call box_exec '{"session_id":"s1","cmd":"test -d /workspace"}' --exit-code

Streaming: when PARAMS_JSON asks for "stream": true (box_exec,
box_exec_start) or the method is box_exec_attach, the command's output is
printed on stderr as it arrives (--stream-format raw: the bytes as the
command wrote them, both streams; jsonl: one box_exec_output per line, for
tools), while stdout still gets only the result. For box_exec_start and
box_exec_attach the call then keeps following the output until the exec
ends (or --timeout); interrupting boxrt call closes its connection, which
cancels a streamed box_exec (status canceled) but leaves a background exec
running. boxrt exec is the short way to run one command.
  boxrt call box_exec '{"session_id":"s1","cmd":"make test","stream":true}'
  boxrt call box_exec_attach '{"exec_id":"x-…"}' --stream-format jsonl 2>&1 >/dev/null | jq .`,
		Flags: append(targetFlags(true),
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "give up on the call after this long (reaching the runtime: at most 10s of it)"},
			&cli.StringFlag{Name: "stream-format", Value: "raw", Usage: "how streamed exec output is printed on stderr: raw or jsonl"},
			&cli.BoolFlag{Name: "exit-code", Usage: "exit with the command's exit code (box_exec, box_exec_wait): 124 if it timed out, 125 if it ended otherwise"},
		),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageOf("call")("%v", err) },
		Action:       flagsAnywhere("call", runCall),
	}
}

type callArgs struct {
	*target
	method  string
	params  json.RawMessage
	timeout time.Duration
	// streamFormat is "raw" or "jsonl"; stream says the call streams.
	streamFormat string
	stream       bool
	exitCode     bool
}

var usageErr = usageOf("call")

// parseCallArgs reads the request, where to send it and how, checking
// each in the order the usage errors are reported.
func parseCallArgs(c *cli.Context, args []string, stdin io.Reader) (*callArgs, error) {
	a := &callArgs{timeout: c.Duration("timeout"), exitCode: c.Bool("exit-code")}
	if a.timeout <= 0 {
		return nil, usageErr("--timeout must be positive")
	}
	var err error
	if a.method, a.params, err = callRequest(args, stdin); err != nil {
		return nil, err
	}
	a.streamFormat = c.String("stream-format")
	if a.streamFormat != "raw" && a.streamFormat != "jsonl" {
		return nil, usageErr("--stream-format must be raw or jsonl, got %q", a.streamFormat)
	}
	a.stream = streams(a.method, a.params)
	if a.target, err = readTarget(c, usageErr); err != nil {
		return nil, err
	}
	return a, nil
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

func runCall(c *cli.Context, args []string) error {
	a, err := parseCallArgs(c, args, os.Stdin)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context, a.timeout)
	defer cancel()
	client, err := a.connect(ctx, c.App.ErrWriter)
	var result json.RawMessage
	if err == nil {
		if a.stream {
			result, err = callStreaming(ctx, client, a, c.App.Writer, c.App.ErrWriter)
		} else {
			err = client.Call(ctx, a.method, a.params, &result)
		}
		// Close before printing: in spawn mode it waits for the child's
		// shutdown, whose log belongs before our verdict.
		_ = client.Close()
	}
	if err != nil {
		a.showLog(c.App.ErrWriter, "call")
		writeIndented(c.App.Writer, callErrorJSON(err, a.timeout))
		return &exitError{code: 1}
	}
	if !a.stream {
		writeIndented(c.App.Writer, result)
	}
	if code, ended := resultExit(result); a.exitCode && ended && code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// commandExit is the exit status of a command's end, for boxrt exec and
// call --exit-code: its exit code, exitTimedOut if it timed out,
// exitNotRun if it ended otherwise (canceled); ended is false while it
// runs, and for results that are no command's end (box_exec_start's).
func commandExit(status string, exitCode *int) (code int, ended bool) {
	switch {
	case exitCode != nil && *exitCode >= 0 && *exitCode <= 255:
		return *exitCode, true
	case status == "timed_out":
		return exitTimedOut, true
	case status == "" || status == "running":
		return 0, false
	}
	return exitNotRun, true
}

// resultExit is commandExit of a call's result.
func resultExit(result json.RawMessage) (code int, ended bool) {
	var r struct {
		Status   string `json:"status"`
		ExitCode *int   `json:"exit_code"`
	}
	if json.Unmarshal(result, &r) != nil {
		return 0, false
	}
	return commandExit(r.Status, r.ExitCode)
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
func callStreaming(ctx context.Context, client *reconnect.Client, a *callArgs, out, errOut io.Writer) (json.RawMessage, error) {
	ended := make(chan reconnect.ExecOutput, 1)
	var result json.RawMessage
	err := client.CallStream(ctx, a.method, a.params, &result, func(o reconnect.ExecOutput) {
		printOutput(errOut, a.streamFormat, o)
		if o.EOF || o.Err != nil {
			ended <- o
		}
	})
	if err != nil {
		return nil, err
	}
	writeIndented(out, result)
	select {
	case o := <-ended:
		return result, o.Err
	case <-ctx.Done():
		return result, fmt.Errorf("following the exec's output: %w", context.Cause(ctx))
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
// host would treat it as. The type is said once: not again as the
// message's prefix, nor in data, which keeps only the details.
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
		out = wireError{Code: e.Code, Type: e.Type, Message: e.Message, Retryable: e.Retryable, Data: errorDetails(e.Data)}
	} else {
		msg := err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			msg = fmt.Sprintf("no answer within --timeout %v: %v", timeout, err)
		}
		out = wireError{Code: reconnect.ErrRuntimeUnavailable.Code, Type: reconnect.ErrRuntimeUnavailable.Type, Message: msg, Retryable: true}
	}
	out.Message = strings.TrimPrefix(out.Message, out.Type+": ")
	if len(out.Data) == 0 {
		out.Data = json.RawMessage("null")
	}
	b, _ := json.Marshal(map[string]wireError{"error": out})
	return b
}

// errorDetails is an error's data without the type and retryable flag,
// which the error object carries already; nil when nothing is left.
func errorDetails(data json.RawMessage) json.RawMessage {
	var d map[string]json.RawMessage
	if json.Unmarshal(data, &d) != nil {
		return data
	}
	delete(d, "type")
	delete(d, "retryable")
	if len(d) == 0 {
		return nil
	}
	b, _ := json.Marshal(d)
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
