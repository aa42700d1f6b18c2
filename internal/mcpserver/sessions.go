package mcpserver

import (
	"context"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/boxrt/boxrt/internal/boxerr"
)

type createSessionArgs struct {
	Session    string `json:"session,omitempty" jsonschema:"a name for the new session (default: a generated one, returned as session_id)"`
	Persistent bool   `json:"persistent,omitempty" jsonschema:"keep the session after this connection ends, across idle time and boxrt restarts, until delete_session. Otherwise it is deleted when this connection ends"`
	Network    string `json:"network,omitempty" jsonschema:"off (default: no network but the sandbox's own loopback) or on"`
	Image      string `json:"image,omitempty" jsonschema:"the sandbox image (docker: an image reference; bwrap: host); default: the configured one"`
}

type namedSession struct {
	Session string `json:"session" jsonschema:"the session's name (session_id)"`
}

type snapshotArgs struct {
	sessionArg
	Mode string `json:"mode,omitempty" jsonschema:"filesystem (default: the session's files)"`
}

type forkArgs struct {
	sessionArg
	NewSession string `json:"new_session,omitempty" jsonschema:"the new session's name (default: a generated one, returned as session_id)"`
	Persistent bool   `json:"persistent,omitempty" jsonschema:"keep the new session after this connection ends; otherwise it is deleted when this connection ends"`
}

func (s *Server) addSessionTools() {
	addTool(s, &mcp.Tool{Name: "create_session",
		Description: "Create a new sandbox session and return its session_id, to pass as \"session\" to the other tools. " +
			"It is deleted when this connection ends unless persistent is true. You only need this for a second sandbox or one that must outlive the connection: the tools use this connection's own session by default."},
		s.createSession)
	addTool(s, &mcp.Tool{Name: "list_sessions", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
		Description: "List the sessions of this boxrt runtime with their state (running, suspended, lost), settings and last use."},
		s.listSessions)
	addTool(s, &mcp.Tool{Name: "delete_session", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)},
		Description: "Delete a session: its processes are killed and its files removed."},
		s.deleteSession)
	addTool(s, &mcp.Tool{Name: "suspend_session",
		Description: "Suspend a session: its processes end, its files are kept, and it uses no memory. The next tool call that uses it resumes it."},
		s.suspendSession)
	addTool(s, &mcp.Tool{Name: "snapshot_session",
		Description: "Store a copy of a session's files as a snapshot and return the snapshot (its snapshot_id)."},
		s.snapshotSession)
	addTool(s, &mcp.Tool{Name: "fork_session",
		Description: "Create a new session with a copy of a session's files (not its processes) and return it; the two then change independently. " +
			"The new session is deleted when this connection ends unless persistent is true."},
		s.forkSession)
}

func (s *Server) createSession(ctx context.Context, req *mcp.CallToolRequest, a createSessionArgs) (*mcp.CallToolResult, error) {
	id := strings.TrimSpace(a.Session)
	if id == "" {
		id = newSessionID()
	}
	params := map[string]any{"session_id": id, "persistent": a.Persistent}
	if a.Network != "" {
		params["network"] = a.Network
	}
	if a.Image != "" {
		params["image"] = a.Image
	}
	var info map[string]any
	if err := s.call(ctx, "box_create_session", params, &info); err != nil {
		return nil, err
	}
	// Only a session this call made is the connection's to delete.
	if created, _ := info["session_created"].(bool); created && !a.Persistent {
		if err := s.own(req, id); err != nil {
			return nil, err
		}
	}
	return result(info), nil
}

func (s *Server) listSessions(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, error) {
	return s.forward(ctx, "box_get_sessions", struct{}{})
}

func (s *Server) deleteSession(ctx context.Context, req *mcp.CallToolRequest, a namedSession) (*mcp.CallToolResult, error) {
	res, err := s.forward(ctx, "box_delete_session", map[string]any{"session_id": a.Session})
	if err == nil {
		s.forget(req, strings.TrimSpace(a.Session))
	}
	return res, err
}

func (s *Server) suspendSession(ctx context.Context, _ *mcp.CallToolRequest, a namedSession) (*mcp.CallToolResult, error) {
	return s.forward(ctx, "box_suspend_session", map[string]any{"session_id": a.Session})
}

func (s *Server) snapshotSession(ctx context.Context, req *mcp.CallToolRequest, a snapshotArgs) (*mcp.CallToolResult, error) {
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	params := map[string]any{"session_id": session}
	if a.Mode != "" {
		params["mode"] = a.Mode
	}
	return s.forward(ctx, "box_snapshot_session", params)
}

func (s *Server) forkSession(ctx context.Context, req *mcp.CallToolRequest, a forkArgs) (*mcp.CallToolResult, error) {
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	id := strings.TrimSpace(a.NewSession)
	if id == "" {
		id = newSessionID()
	}
	if id == session {
		return nil, boxerr.Validation("new_session", "new_session must differ from the session forked")
	}
	res, err := s.forward(ctx, "box_fork_session", map[string]any{"session_id": session, "new_session_id": id})
	if err == nil && !a.Persistent {
		err = s.own(req, id)
	}
	return res, err
}
