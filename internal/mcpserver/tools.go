package mcpserver

import (
	"context"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// handler is one tool: its arguments decoded (the SDK validated them
// against the schema it derived from In), a result or boxrt's error.
type handler[In any] func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, error)

// addTool registers a tool whose failures are isError results carrying
// boxrt's error type and a hint, never protocol errors a model would not
// see.
func addTool[In any](s *Server, t *mcp.Tool, h handler[In]) {
	mcp.AddTool(s.mcp, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
		release, err := s.slot()
		if err != nil {
			return toolError(err), nil, nil
		}
		defer release()
		start := time.Now()
		res, err := h(ctx, req, in)
		if err != nil {
			res = toolError(err)
		}
		s.log.Debug().Str("tool", t.Name).Bool("is_error", res.IsError).Dur("took", time.Since(start)).Msg("MCP tool call")
		return res, nil, nil
	})
}

// addTools registers every tool.
func (s *Server) addTools() {
	s.addCommandTools()
	s.addFileTools()
	s.addSessionTools()
}

// sessionArg is the optional "session" argument every sandbox tool takes.
type sessionArg struct {
	Session string `json:"session,omitempty" jsonschema:"the session (sandbox) to use; leave it out to use this connection's own session, which is created on first use and deleted when the connection ends. A named session outlives the connection"`
}
