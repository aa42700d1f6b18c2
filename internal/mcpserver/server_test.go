package mcpserver

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
)

// catalogue is a fake rpc.Handler: it records every call and answers with
// the function its method maps to.
type catalogue struct {
	mu      sync.Mutex
	calls   []call
	answers map[string]func(ctx context.Context, params map[string]any) (any, error)
}

type call struct {
	method string
	params map[string]any
}

func (c *catalogue) Handle(ctx context.Context, req *rpc.Request) (json.RawMessage, error) {
	var p map[string]any
	if err := json.Unmarshal(req.Params, &p); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.calls = append(c.calls, call{req.Method, p})
	answer := c.answers[req.Method]
	c.mu.Unlock()
	if answer == nil {
		return json.RawMessage(`{}`), nil
	}
	v, err := answer(ctx, p)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func (c *catalogue) methods() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.calls))
	for i, cl := range c.calls {
		out[i] = cl.method
	}
	return out
}

// last returns the params of the last call of method.
func (c *catalogue) last(t *testing.T, method string) map[string]any {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.calls) - 1; i >= 0; i-- {
		if c.calls[i].method == method {
			return c.calls[i].params
		}
	}
	t.Fatalf("no %s call in %v", method, c.calls)
	return nil
}

func exited(code int, stdout string) func(context.Context, map[string]any) (any, error) {
	return func(_ context.Context, p map[string]any) (any, error) {
		return map[string]any{"session_id": p["session_id"], "status": "completed", "exit_code": code, "stdout": stdout, "stderr": ""}, nil
	}
}

// connect serves a Server over h to an in-memory client; opts may be nil.
func connect(t *testing.T, h rpc.Handler, opts *mcp.ClientOptions) (*Server, *mcp.ClientSession) {
	t.Helper()
	s := New(h, Options{Version: "test", Log: zerolog.Nop()})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.mcp.Connect(context.Background(), st, nil)
	require.NoError(t, err)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(context.Background(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
		s.Close(context.Background())
	})
	return s, cs
}

func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	return res
}

func text(res *mcp.CallToolResult) string {
	if len(res.Content) == 0 {
		return ""
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

func TestToolsAreListedWithSchemas(t *testing.T) {
	_, cs := connect(t, &catalogue{}, nil)
	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	byName := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		byName[tool.Name] = tool
		assert.NotEmpty(t, tool.Description, tool.Name)
	}
	for _, name := range []string{"run_command", "start_command", "read_command_output", "stop_command",
		"read_file", "write_file", "list_files", "stat_file", "remove_file",
		"create_session", "list_sessions", "delete_session", "suspend_session", "snapshot_session", "fork_session"} {
		require.Contains(t, byName, name)
	}
	assert.Len(t, byName, 15)
	schema, err := json.Marshal(byName["run_command"].InputSchema)
	require.NoError(t, err)
	var s struct {
		Required   []string                  `json:"required"`
		Properties map[string]map[string]any `json:"properties"`
	}
	require.NoError(t, json.Unmarshal(schema, &s))
	assert.Equal(t, []string{"command"}, s.Required)
	for _, arg := range []string{"command", "timeout_sec", "session"} {
		assert.NotEmpty(t, s.Properties[arg]["description"], arg)
	}
}

func TestRunCommandUsesTheConnectionsSessionAndDeletesIt(t *testing.T) {
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){"box_exec": exited(0, "hi\n")}}
	s, cs := connect(t, c, nil)
	res := callTool(t, cs, "run_command", map[string]any{"command": "echo hi", "timeout_sec": 5})
	assert.False(t, res.IsError, text(res))
	assert.Contains(t, text(res), "exit code 0")
	assert.Contains(t, text(res), "hi\n")
	exec := c.last(t, "box_exec")
	id := c.last(t, "box_create_session")["session_id"]
	assert.Regexp(t, `^mcp-[0-9a-f]{12}$`, id)
	assert.Equal(t, map[string]any{"session_id": id, "cmd": "echo hi", "timeout_sec": 5.0, "max_output_bytes": float64(toolOutputBytes)}, exec)

	// The default session is created once.
	callTool(t, cs, "run_command", map[string]any{"command": "true"})
	assert.Equal(t, []string{"box_create_session", "box_exec", "box_exec"}, c.methods())

	require.NoError(t, cs.Close())
	s.Close(context.Background())
	assert.Equal(t, map[string]any{"session_id": id}, c.last(t, "box_delete_session"))
}

func TestNamedSessionOutlivesTheConnection(t *testing.T) {
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){"box_exec": exited(0, "")}}
	s, cs := connect(t, c, nil)
	callTool(t, cs, "run_command", map[string]any{"command": "true", "session": "keep"})
	assert.Equal(t, "keep", c.last(t, "box_exec")["session_id"])
	require.NoError(t, cs.Close())
	s.Close(context.Background())
	assert.Equal(t, []string{"box_exec"}, c.methods())
}

func TestNonZeroExitIsAToolError(t *testing.T) {
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){"box_exec": exited(3, "partial\n")}}
	_, cs := connect(t, c, nil)
	res := callTool(t, cs, "run_command", map[string]any{"command": "exit 3"})
	assert.True(t, res.IsError)
	assert.Contains(t, text(res), "exit code 3")
	assert.Contains(t, text(res), "partial\n")
	var r execResult
	b, _ := json.Marshal(res.StructuredContent)
	require.NoError(t, json.Unmarshal(b, &r))
	require.NotNil(t, r.ExitCode)
	assert.Equal(t, 3, *r.ExitCode)
}

func TestBoxrtFailureIsAToolErrorWithTypeAndHint(t *testing.T) {
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){
		"box_exec": func(context.Context, map[string]any) (any, error) {
			return nil, boxerr.Validation("cmd", "cmd must not be empty")
		},
	}}
	_, cs := connect(t, c, nil)
	res := callTool(t, cs, "run_command", map[string]any{"command": " ", "session": "s"})
	assert.True(t, res.IsError)
	assert.Contains(t, text(res), "BoxValidationError: cmd must not be empty")
	assert.Contains(t, text(res), `"command"`)
	b, _ := json.Marshal(res.StructuredContent)
	assert.JSONEq(t, `{"error":{"type":"BoxValidationError","code":-32602,"message":"cmd must not be empty","retryable":false,"details":{"field":"cmd"}},"hint":"fix the argument \"command\" and call the tool again"}`, string(b))
}

func TestRunCommandStreamsProgress(t *testing.T) {
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){
		"box_exec": func(ctx context.Context, p map[string]any) (any, error) {
			if p["stream"] != true {
				return nil, boxerr.Failure("not streamed")
			}
			for _, n := range []string{`{"exec_id":"x","seq":0,"stream":"stdout","offset":0,"data":"one\n"}`,
				`{"exec_id":"x","seq":1,"stream":"stderr","offset":0,"data_base64":"/3R3bwo="}`,
				`{"exec_id":"x","seq":2,"offset":0,"eof":true}`} {
				if err := rpc.NotifyJSON(ctx, "box_exec_output", json.RawMessage(n), false); err != nil {
					return nil, err
				}
			}
			return exited(0, "one\n")(ctx, p)
		},
	}}
	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	_, cs := connect(t, c, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		got = append(got, req.Params)
		mu.Unlock()
	}})
	params := &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "x", "session": "s"}}
	params.SetProgressToken("tok")
	res, err := cs.CallTool(context.Background(), params)
	require.NoError(t, err)
	assert.False(t, res.IsError, text(res))
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "one\n", got[0].Message)
	assert.Equal(t, "stdout", got[0].Meta["stream"])
	assert.Equal(t, "\uFFFDtwo\n", got[1].Message)
	assert.Equal(t, "stderr", got[1].Meta["stream"])
	assert.Equal(t, "tok", got[1].ProgressToken)
	assert.Less(t, got[0].Progress, got[1].Progress)

	// Without a token nothing streams.
	callTool(t, cs, "run_command", map[string]any{"command": "x", "session": "s"})
	assert.NotContains(t, c.last(t, "box_exec"), "stream")
}

func TestCancellationReachesTheCommand(t *testing.T) {
	cancelled := make(chan struct{})
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){
		"box_exec": func(ctx context.Context, _ map[string]any) (any, error) {
			<-ctx.Done()
			close(cancelled)
			return map[string]any{"status": "canceled"}, nil
		},
	}}
	_, cs := connect(t, c, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "sleep 60", "session": "s"}})
		errc <- err
	}()
	require.Eventually(t, func() bool { return len(c.methods()) == 1 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the command's context was not cancelled")
	}
	assert.Error(t, <-errc)
}

func TestReadCommandOutputWaits(t *testing.T) {
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){
		"box_exec_wait": func(context.Context, map[string]any) (any, error) {
			return map[string]any{"status": "running", "exit_code": nil, "stdout": "so far\n"}, nil
		},
	}}
	_, cs := connect(t, c, nil)
	res := callTool(t, cs, "read_command_output", map[string]any{"exec_id": "x-1"})
	assert.False(t, res.IsError, "a running command is no error: %s", text(res))
	assert.Contains(t, text(res), "so far\n")
	// box_exec_wait's 0 waits for the end: "at once" is the smallest wait.
	assert.Equal(t, map[string]any{"exec_id": "x-1", "timeout_sec": minWaitSec}, c.last(t, "box_exec_wait"))
	callTool(t, cs, "read_command_output", map[string]any{"exec_id": "x-1", "wait_sec": 2.5})
	assert.Equal(t, 2.5, c.last(t, "box_exec_wait")["timeout_sec"])
	res = callTool(t, cs, "read_command_output", map[string]any{"exec_id": "x-1", "wait_sec": 301})
	assert.True(t, res.IsError)
	assert.Contains(t, text(res), `"wait_sec"`)
	assert.Len(t, c.methods(), 2)
}

func TestFileTools(t *testing.T) {
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){
		"box_fs_read": func(_ context.Context, p map[string]any) (any, error) {
			if p["path"] == "/workspace/bin" {
				return map[string]any{"data_base64": "/wA=", "size": 2, "eof": true}, nil
			}
			return map[string]any{"data_base64": "aGVsbG8=", "size": 5, "eof": true}, nil
		},
	}}
	_, cs := connect(t, c, nil)
	res := callTool(t, cs, "write_file", map[string]any{"path": "/workspace/a", "content": "hello", "session": "s"})
	assert.False(t, res.IsError, text(res))
	assert.Equal(t, map[string]any{"session_id": "s", "path": "/workspace/a", "data_base64": "aGVsbG8=", "append": false}, c.last(t, "box_fs_write"))
	callTool(t, cs, "write_file", map[string]any{"path": "/workspace/b", "content_base64": "/wA=", "mode": 493, "session": "s"})
	assert.Equal(t, map[string]any{"session_id": "s", "path": "/workspace/b", "data_base64": "/wA=", "append": false, "mode": 493.0}, c.last(t, "box_fs_write"))
	res = callTool(t, cs, "write_file", map[string]any{"path": "/workspace/b", "content": "x", "content_base64": "eA==", "session": "s"})
	assert.True(t, res.IsError)
	assert.Contains(t, text(res), "BoxValidationError")

	res = callTool(t, cs, "read_file", map[string]any{"path": "/workspace/a", "session": "s"})
	assert.JSONEq(t, `{"content":"hello","size":5,"eof":true}`, text(res))
	res = callTool(t, cs, "read_file", map[string]any{"path": "/workspace/a", "encoding": "base64", "session": "s"})
	assert.JSONEq(t, `{"content_base64":"aGVsbG8=","size":5,"eof":true}`, text(res))
	res = callTool(t, cs, "read_file", map[string]any{"path": "/workspace/bin", "session": "s"})
	assert.JSONEq(t, `{"content_base64":"/wA=","size":2,"eof":true}`, text(res))

	callTool(t, cs, "list_files", map[string]any{"session": "s"})
	assert.Equal(t, map[string]any{"session_id": "s", "path": "/workspace"}, c.last(t, "box_fs_list"))
	callTool(t, cs, "remove_file", map[string]any{"path": "/workspace/d", "recursive": true, "session": "s"})
	assert.Equal(t, map[string]any{"session_id": "s", "path": "/workspace/d", "recursive": true}, c.last(t, "box_fs_remove"))
}

func TestSessionToolsOwnWhatTheyMake(t *testing.T) {
	c := &catalogue{answers: map[string]func(context.Context, map[string]any) (any, error){
		"box_create_session": func(_ context.Context, p map[string]any) (any, error) {
			return map[string]any{"session_id": p["session_id"], "session_created": true}, nil
		},
	}}
	s, cs := connect(t, c, nil)
	callTool(t, cs, "create_session", map[string]any{"session": "tmp"})
	callTool(t, cs, "create_session", map[string]any{"session": "kept", "persistent": true})
	assert.Equal(t, true, c.last(t, "box_create_session")["persistent"])
	callTool(t, cs, "fork_session", map[string]any{"session": "kept", "new_session": "copy"})
	assert.Equal(t, map[string]any{"session_id": "kept", "new_session_id": "copy"}, c.last(t, "box_fork_session"))
	callTool(t, cs, "suspend_session", map[string]any{"session": "kept"})
	callTool(t, cs, "snapshot_session", map[string]any{"session": "kept"})
	callTool(t, cs, "list_sessions", nil)
	require.NoError(t, cs.Close())
	s.Close(context.Background())

	var deleted []string
	for _, cl := range c.calls {
		if cl.method == "box_delete_session" {
			deleted = append(deleted, cl.params["session_id"].(string))
		}
	}
	assert.ElementsMatch(t, []string{"tmp", "copy"}, deleted)
	for _, m := range []string{"box_suspend_session", "box_snapshot_session", "box_get_sessions"} {
		assert.Contains(t, c.methods(), m)
	}
}
