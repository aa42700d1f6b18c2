package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
)

// toolOutputBytes is the output a command tool keeps per stream: boxrt's
// head-and-tail cap (max_output_bytes), sized for a model's context rather
// than for a host's.
const toolOutputBytes = 32 << 10

// minWaitSec is read_command_output's wait when the model asks for none:
// box_exec_wait takes 0 as "until the end".
const minWaitSec = 0.001

// maxWaitSec bounds read_command_output's wait: a model polls a long
// command rather than holding a call open for its whole life.
const maxWaitSec = 300

type runArgs struct {
	sessionArg
	Command    string            `json:"command" jsonschema:"the shell command line, run with /bin/sh -c in the session's sandbox"`
	TimeoutSec int               `json:"timeout_sec,omitempty" jsonschema:"seconds before the command and everything it started are killed (1 to 86400; default 30)"`
	Workdir    string            `json:"workdir,omitempty" jsonschema:"absolute working directory inside the sandbox (default: the workspace, /workspace)"`
	Env        map[string]string `json:"env,omitempty" jsonschema:"environment variables for the command"`
}

// spec is the Spec members a command tool sends.
func (a runArgs) spec(session string) map[string]any {
	p := map[string]any{"session_id": session, "cmd": a.Command, "max_output_bytes": toolOutputBytes}
	if a.TimeoutSec != 0 {
		p["timeout_sec"] = a.TimeoutSec
	}
	if a.Workdir != "" {
		p["workdir"] = a.Workdir
	}
	if len(a.Env) > 0 {
		p["env"] = a.Env
	}
	return p
}

type execRef struct {
	ExecID string `json:"exec_id" jsonschema:"the id start_command returned"`
}

type readOutputArgs struct {
	execRef
	WaitSec float64 `json:"wait_sec,omitempty" jsonschema:"seconds to wait for the command to end before answering with its output so far (0 to 300; default 0: answer at once)"`
}

type stopArgs struct {
	execRef
	Signal string `json:"signal,omitempty" jsonschema:"KILL (default: the command and everything it started), TERM, INT, HUP, QUIT, USR1 or USR2"`
}

func (s *Server) addCommandTools() {
	addTool(s, &mcp.Tool{Name: "run_command", Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
		Description: "Run a shell command in a sandbox and wait for it to end. Returns its exit code, stdout and stderr (long output keeps its head and tail). " +
			"A non-zero exit code or a timeout is reported as an error with the output. Output is streamed as progress notifications while the command runs when the client asks for progress. " +
			"Files and background processes stay in the session for the next command. For servers and other long-running work use start_command."},
		s.runCommand)
	addTool(s, &mcp.Tool{Name: "start_command", Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
		Description: "Start a shell command in the background in a sandbox and return its exec_id at once (default timeout 3600 s). " +
			"Read its output with read_command_output and end it with stop_command."},
		s.startCommand)
	addTool(s, &mcp.Tool{Name: "read_command_output", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
		Description: "Read the output of a command started with start_command: its status (running, completed, timed_out, canceled), exit code once ended, and its stdout and stderr so far. " +
			"wait_sec waits up to that long for the command to end first."},
		s.readCommandOutput)
	addTool(s, &mcp.Tool{Name: "stop_command", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)},
		Description: "Stop a command started with start_command (by default SIGKILL to it and everything it started) and return its final state."},
		s.stopCommand)
}

func ptr[T any](v T) *T { return &v }

// runCommand is box_exec; with the client's progress token, its output
// streams as progress notifications, and a cancelled call kills it.
func (s *Server) runCommand(ctx context.Context, req *mcp.CallToolRequest, a runArgs) (*mcp.CallToolResult, error) {
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	params := a.spec(session)
	if token := req.Params.GetProgressToken(); token != nil {
		params["stream"] = true
		ctx = rpc.WithNotifier(ctx, progressNotifier(ctx, req.Session, token))
	}
	var r execResult
	if err := s.call(ctx, "box_exec", params, &r); err != nil {
		return nil, err
	}
	return commandResult(r), nil
}

func (s *Server) startCommand(ctx context.Context, req *mcp.CallToolRequest, a runArgs) (*mcp.CallToolResult, error) {
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	return s.forward(ctx, "box_exec_start", a.spec(session))
}

func (s *Server) readCommandOutput(ctx context.Context, _ *mcp.CallToolRequest, a readOutputArgs) (*mcp.CallToolResult, error) {
	if a.WaitSec < 0 || a.WaitSec > maxWaitSec {
		return nil, boxerr.Validation("wait_sec", "wait_sec must be between 0 and %d, got %v", maxWaitSec, a.WaitSec)
	}
	var r execResult
	if err := s.call(ctx, "box_exec_wait", map[string]any{"exec_id": a.ExecID, "timeout_sec": max(a.WaitSec, minWaitSec)}, &r); err != nil {
		return nil, err
	}
	return commandResult(r), nil
}

func (s *Server) stopCommand(ctx context.Context, _ *mcp.CallToolRequest, a stopArgs) (*mcp.CallToolResult, error) {
	return s.forward(ctx, "box_exec_kill", map[string]any{"exec_id": a.ExecID, "signal": a.Signal})
}

// outputNotice is the part of box_exec_output's params a progress
// notification carries.
type outputNotice struct {
	Stream     string `json:"stream"`
	Data       string `json:"data"`
	DataBase64 string `json:"data_base64"`
	EOF        bool   `json:"eof"`
}

// progressNotifier turns a streamed command's output notifications into
// progress notifications for token: the progress is the bytes of output so
// far, the message the chunk (invalid UTF-8 replaced), _meta.stream stdout
// or stderr. It is called by one goroutine at a time (the exec's sink),
// and a client slow to read slows the command, as a streaming JSON-RPC
// host does.
func progressNotifier(ctx context.Context, ss *mcp.ServerSession, token any) rpc.Notifier {
	var total int
	return func(method string, params json.RawMessage) error {
		var n outputNotice
		if method != actions.OutputNotification || json.Unmarshal(params, &n) != nil || n.EOF {
			return nil
		}
		text := n.Data
		if n.DataBase64 != "" {
			b, err := base64.StdEncoding.DecodeString(n.DataBase64)
			if err != nil {
				return nil
			}
			text = strings.ToValidUTF8(string(b), "\uFFFD")
		}
		total += len(text)
		return ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(total), Message: text,
			Meta: mcp.Meta{"stream": n.Stream}})
	}
}
