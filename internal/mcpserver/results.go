package mcpserver

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
)

// result is a successful tool result: v as structured content and as the
// JSON text older clients and models read.
func result(v any) *mcp.CallToolResult {
	b, err := json.Marshal(v)
	if err != nil {
		return toolError(boxerr.Failure("cannot encode the result: %v", err))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}
}

// toolFailure is the structured content of a tool error from boxrt: the
// wire error (type, code, message, retryable, details) and what to do.
type toolFailure struct {
	Error wireError `json:"error"`
	Hint  string    `json:"hint,omitempty"`
}

type wireError struct {
	Type      string         `json:"type"`
	Code      int64          `json:"code"`
	Message   string         `json:"message"`
	Retryable bool           `json:"retryable"`
	Details   map[string]any `json:"details,omitempty"`
}

// toolError is boxrt's failure as an isError result, encoded as the
// JSON-RPC wire encodes it, so a model sees the same type and message a
// host would.
func toolError(err error) *mcp.CallToolResult {
	e := rpc.Encode(actions.EncodeError, err)
	f := toolFailure{Error: wireError{Type: e.Type, Code: e.Code, Message: e.Message, Retryable: e.Retryable, Details: e.Details}, Hint: hintFor(e)}
	text := e.Type + ": " + e.Message
	if f.Hint != "" {
		text += "\nHint: " + f.Hint
	}
	b, _ := json.Marshal(f) // plain values only
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: json.RawMessage(b)}
}

// hintFor says, in terms of the tools, what a model can do about e.
func hintFor(e *rpc.Error) string {
	switch e.Type {
	case boxerr.ErrValidation.Type:
		if field, ok := e.Details["field"].(string); ok {
			if arg, renamed := toolArgs[field]; renamed {
				field = arg
			}
			return fmt.Sprintf("fix the argument %q and call the tool again", field)
		}
		return "fix the arguments and call the tool again"
	case boxerr.ErrSessionNotFound.Type:
		return "the session does not exist: leave out \"session\" to use this connection's own, or make one with create_session (list_sessions shows them)"
	case boxerr.ErrFileNotFound.Type:
		return "no such path: list_files shows what is there"
	case boxerr.ErrSessionConflict.Type:
		return "a session of that name exists with other settings: use another name, or the session as it is"
	}
	if e.Retryable {
		return "a passing condition: the same call may succeed later"
	}
	return ""
}

// toolArgs names the tools' arguments by the catalogue's params where the
// two differ, for the field a validation error names.
var toolArgs = map[string]string{"cmd": "command", "session_id": "session", "new_session_id": "new_session", "data_base64": "content_base64"}

// execResult is the part of box_exec's and box_exec_wait's ExecResult the
// command tools report.
type execResult struct {
	SessionID       string `json:"session_id"`
	Status          string `json:"status"`
	ExitCode        *int   `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	DurationMS      int64  `json:"duration_ms"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	SessionCreated  bool   `json:"session_created"`
	Restarted       bool   `json:"restarted"`
}

// commandResult is a command's outcome as a tool result: an error result
// unless it completed with exit code 0 (or, from read_command_output, still
// runs), with the exit code and output in the text a model reads first.
func commandResult(r execResult) *mcp.CallToolResult {
	res := result(r)
	failed := r.Status != "running" && (r.Status != "completed" || r.ExitCode == nil || *r.ExitCode != 0)
	var b strings.Builder
	switch {
	case r.Status == "completed" && r.ExitCode != nil:
		fmt.Fprintf(&b, "exit code %d", *r.ExitCode)
	case r.Status == "timed_out":
		b.WriteString("timed out (its processes were killed; raise timeout_sec or use start_command)")
	default:
		b.WriteString(r.Status)
	}
	section(&b, "stdout", r.Stdout, r.StdoutTruncated)
	section(&b, "stderr", r.Stderr, r.StderrTruncated)
	res.Content = []mcp.Content{&mcp.TextContent{Text: b.String()}}
	res.IsError = failed
	return res
}

func section(b *strings.Builder, name, out string, cut bool) {
	if out == "" {
		return
	}
	b.WriteString("\n--- " + name)
	if cut {
		b.WriteString(" (middle omitted: it was longer than boxrt keeps)")
	}
	b.WriteString(" ---\n")
	b.WriteString(out)
}
