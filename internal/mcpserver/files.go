package mcpserver

import (
	"context"
	"encoding/base64"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/boxrt/boxrt/internal/boxerr"
)

type pathArg struct {
	sessionArg
	Path string `json:"path" jsonschema:"the path as the sandbox sees it, e.g. /workspace/main.py (the workspace, /tmp and the session's other mounts are reachable)"`
}

type readFileArgs struct {
	pathArg
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default: UTF-8 text; a file that is not valid UTF-8 comes back as base64) or base64"`
	Offset   int64  `json:"offset,omitempty" jsonschema:"byte offset to start reading at (default 0)"`
	Length   *int64 `json:"length,omitempty" jsonschema:"bytes to read at most (default: the rest of the file; at most 8 MiB per call)"`
}

type writeFileArgs struct {
	pathArg
	Content       *string `json:"content,omitempty" jsonschema:"the file's new content as text (give content or content_base64)"`
	ContentBase64 *string `json:"content_base64,omitempty" jsonschema:"the file's new content as standard base64, for bytes that are not text"`
	Append        bool    `json:"append,omitempty" jsonschema:"append to the file instead of replacing it"`
	Mode          *uint32 `json:"mode,omitempty" jsonschema:"permission bits as a number, e.g. 493 for 0755 (default: an existing file keeps its mode, a new one gets 0644)"`
}

type listFilesArgs struct {
	sessionArg
	Path  string `json:"path,omitempty" jsonschema:"the directory to list (default /workspace)"`
	Depth int    `json:"depth,omitempty" jsonschema:"levels to descend, 1 to 16 (default 1: the directory's entries)"`
}

type removeFileArgs struct {
	pathArg
	Recursive bool `json:"recursive,omitempty" jsonschema:"remove a directory and everything below it"`
}

func (s *Server) addFileTools() {
	addTool(s, &mcp.Tool{Name: "read_file", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
		Description: "Read a file in a sandbox. Returns {content} as text, or {content_base64} for encoding base64 or a file that is not UTF-8, with the file's size and whether the end was reached."},
		s.readFile)
	addTool(s, &mcp.Tool{Name: "write_file", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)},
		Description: "Write a file in a sandbox from text (content) or bytes (content_base64), replacing it atomically unless append is set. Missing parent directories are created. At most 8 MiB per call."},
		s.writeFile)
	addTool(s, &mcp.Tool{Name: "list_files", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
		Description: "List a directory in a sandbox: each entry's name, path, type (file, dir, symlink, other), size, mode and modification time."},
		s.listFiles)
	addTool(s, &mcp.Tool{Name: "stat_file", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
		Description: "Describe one path in a sandbox (type, size, mode, modification time); a symlink is described itself, not its target."},
		s.statFile)
	addTool(s, &mcp.Tool{Name: "remove_file", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)},
		Description: "Remove a file, symlink or empty directory in a sandbox; recursive removes a directory tree."},
		s.removeFile)
}

type fileRead struct {
	Content       *string `json:"content,omitempty"`
	ContentBase64 string  `json:"content_base64,omitempty"`
	Size          int64   `json:"size"`
	EOF           bool    `json:"eof"`
}

func (s *Server) readFile(ctx context.Context, req *mcp.CallToolRequest, a readFileArgs) (*mcp.CallToolResult, error) {
	if a.Encoding != "" && a.Encoding != "text" && a.Encoding != "base64" {
		return nil, boxerr.Validation("encoding", "encoding must be text or base64, got %q", a.Encoding)
	}
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	params := map[string]any{"session_id": session, "path": a.Path, "offset": a.Offset}
	if a.Length != nil {
		params["length"] = *a.Length
	}
	var r struct {
		DataBase64 string `json:"data_base64"`
		Size       int64  `json:"size"`
		EOF        bool   `json:"eof"`
	}
	if err := s.call(ctx, "box_fs_read", params, &r); err != nil {
		return nil, err
	}
	out := fileRead{ContentBase64: r.DataBase64, Size: r.Size, EOF: r.EOF}
	if a.Encoding != "base64" {
		if b, err := base64.StdEncoding.DecodeString(r.DataBase64); err == nil && utf8.Valid(b) {
			text := string(b)
			out.Content, out.ContentBase64 = &text, ""
		}
	}
	return result(out), nil
}

func (s *Server) writeFile(ctx context.Context, req *mcp.CallToolRequest, a writeFileArgs) (*mcp.CallToolResult, error) {
	var data string
	switch {
	case a.Content != nil && a.ContentBase64 != nil:
		return nil, boxerr.Validation("content", "give content or content_base64, not both")
	case a.Content != nil:
		data = base64.StdEncoding.EncodeToString([]byte(*a.Content))
	case a.ContentBase64 != nil:
		data = *a.ContentBase64
	default:
		return nil, boxerr.Validation("content", "give content (text) or content_base64")
	}
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	params := map[string]any{"session_id": session, "path": a.Path, "data_base64": data, "append": a.Append}
	if a.Mode != nil {
		params["mode"] = *a.Mode
	}
	return s.forward(ctx, "box_fs_write", params)
}

func (s *Server) listFiles(ctx context.Context, req *mcp.CallToolRequest, a listFilesArgs) (*mcp.CallToolResult, error) {
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	params := map[string]any{"session_id": session, "path": a.Path}
	if a.Path == "" {
		params["path"] = "/workspace"
	}
	if a.Depth != 0 {
		params["depth"] = a.Depth
	}
	return s.forward(ctx, "box_fs_list", params)
}

func (s *Server) statFile(ctx context.Context, req *mcp.CallToolRequest, a pathArg) (*mcp.CallToolResult, error) {
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	return s.forward(ctx, "box_fs_stat", map[string]any{"session_id": session, "path": a.Path})
}

func (s *Server) removeFile(ctx context.Context, req *mcp.CallToolRequest, a removeFileArgs) (*mcp.CallToolResult, error) {
	session, err := s.session(ctx, req, a.Session)
	if err != nil {
		return nil, err
	}
	if err := s.call(ctx, "box_fs_remove", map[string]any{"session_id": session, "path": a.Path, "recursive": a.Recursive}, nil); err != nil {
		return nil, err
	}
	return result(map[string]any{"removed": a.Path}), nil
}

// forward calls method and returns its result as the tool's.
func (s *Server) forward(ctx context.Context, method string, params any) (*mcp.CallToolResult, error) {
	var r map[string]any
	if err := s.call(ctx, method, params, &r); err != nil {
		return nil, err
	}
	return result(r), nil
}
