package reconnect

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// File helpers. Small files and metadata go through the box_fs_* methods
// on the link; Upload and Download stream through the runtime's files
// endpoint (GET/PUT /v1/sessions/{id}/files) with no size limit, which
// the RPC methods have (MaxRPCFileBytes).

// MaxRPCFileBytes is the most data one box_fs_read or box_fs_write moves.
const MaxRPCFileBytes = 8 << 20

// FileInfo is a file as the sandbox sees it (box_fs_stat, box_fs_list).
type FileInfo struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	NameBase64 string    `json:"name_base64,omitempty"`
	PathBase64 string    `json:"path_base64,omitempty"`
	Type       string    `json:"type"` // file, dir, symlink, other
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"`
	MTime      time.Time `json:"mtime"`
}

// RawPath is the path's bytes (path_base64 when the runtime sent one).
func (fi FileInfo) RawPath() string {
	if fi.PathBase64 != "" {
		if b, err := base64.StdEncoding.DecodeString(fi.PathBase64); err == nil {
			return string(b)
		}
	}
	return fi.Path
}

// pathArg puts a path into params: as path_base64 when JSON cannot carry
// it (not UTF-8).
func pathArg(params map[string]any, key, p string) map[string]any {
	if utf8.ValidString(p) {
		params[key] = p
	} else {
		params[key+"_base64"] = base64.StdEncoding.EncodeToString([]byte(p))
	}
	return params
}

// ReadFile returns a whole file through box_fs_read, in chunks of
// MaxRPCFileBytes; Download streams instead.
func (c *Client) ReadFile(ctx context.Context, sessionID, path string) ([]byte, error) {
	var out []byte
	for {
		var r struct {
			DataBase64 string `json:"data_base64"`
			EOF        bool   `json:"eof"`
		}
		params := pathArg(map[string]any{"session_id": sessionID, "offset": len(out), "length": MaxRPCFileBytes}, "path", path)
		if err := c.Call(ctx, "box_fs_read", params, &r); err != nil {
			return nil, err
		}
		b, err := base64.StdEncoding.DecodeString(r.DataBase64)
		if err != nil {
			return nil, fmt.Errorf("reconnect: box_fs_read: %w", err)
		}
		out = append(out, b...)
		if r.EOF || len(b) == 0 {
			return out, nil
		}
	}
}

// WriteFile replaces path with data (parents created; mode 0 keeps an
// existing file's mode, else 0644) through box_fs_write. Above
// MaxRPCFileBytes use Upload.
func (c *Client) WriteFile(ctx context.Context, sessionID, path string, data []byte, mode fs.FileMode) error {
	params := pathArg(map[string]any{"session_id": sessionID, "data_base64": base64.StdEncoding.EncodeToString(data)}, "path", path)
	if mode != 0 {
		params["mode"] = uint32(mode.Perm())
	}
	return c.Call(ctx, "box_fs_write", params, nil)
}

// ListFiles lists dir down to depth levels (1: its entries).
func (c *Client) ListFiles(ctx context.Context, sessionID, dir string, depth int) ([]FileInfo, error) {
	var r struct {
		Entries []FileInfo `json:"entries"`
	}
	err := c.Call(ctx, "box_fs_list", pathArg(map[string]any{"session_id": sessionID, "depth": depth}, "path", dir), &r)
	return r.Entries, err
}

// StatFile describes path (a symlink itself, not its target).
func (c *Client) StatFile(ctx context.Context, sessionID, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.Call(ctx, "box_fs_stat", pathArg(map[string]any{"session_id": sessionID}, "path", path), &fi)
	return fi, err
}

// RemoveFile removes a file or an empty directory; recursive, a tree.
func (c *Client) RemoveFile(ctx context.Context, sessionID, path string, recursive bool) error {
	return c.Call(ctx, "box_fs_remove", pathArg(map[string]any{"session_id": sessionID, "recursive": recursive}, "path", path), nil)
}

// MakeDir creates a directory and its parents.
func (c *Client) MakeDir(ctx context.Context, sessionID, path string) error {
	return c.Call(ctx, "box_fs_mkdir", pathArg(map[string]any{"session_id": sessionID}, "path", path), nil)
}

// RenameFile renames from to to inside the session.
func (c *Client) RenameFile(ctx context.Context, sessionID, from, to string) error {
	params := pathArg(pathArg(map[string]any{"session_id": sessionID}, "from", from), "to", to)
	return c.Call(ctx, "box_fs_rename", params, nil)
}

// filesURL is the files endpoint for path, with the token to send: for
// Dial, the dialed runtime and WithToken's token; for Spawn, the child's
// listener and the token it returned (box_health's relay_url and
// relay_token).
func (c *Client) filesURL(ctx context.Context, sessionID, path string, query url.Values) (string, string, error) {
	base, token := c.o.httpBase, c.o.token
	if base == "" || token == "" {
		var h struct {
			RelayURL   string `json:"relay_url"`
			RelayToken string `json:"relay_token"`
		}
		if err := c.Call(ctx, "box_health", map[string]any{}, &h); err != nil {
			return "", "", err
		}
		if base == "" {
			base = h.RelayURL
		}
		if token == "" {
			token = h.RelayToken
		}
	}
	if base == "" {
		return "", "", errors.New("reconnect: the runtime has no HTTP listener (started with --listen ''), so files cannot stream")
	}
	query.Set("path", path)
	return strings.TrimSuffix(base, "/") + "/v1/sessions/" + url.PathEscape(sessionID) + "/files?" + query.Encode(), token, nil
}

// httpBase is the http(s) origin of a normalised WebSocket URL.
func httpBase(wsURL string) string {
	u, err := url.Parse(wsURL)
	if err != nil {
		return ""
	}
	scheme := "http"
	if u.Scheme == "wss" {
		scheme = "https"
	}
	return scheme + "://" + u.Host
}

func (c *Client) httpClient() *http.Client {
	if c.o.httpClient != nil {
		return c.o.httpClient
	}
	return http.DefaultClient
}

// doFiles sends one request to the files endpoint and returns the
// response when it succeeded, else the runtime's typed error.
func (c *Client) doFiles(ctx context.Context, method, sessionID, path string, query url.Values, body io.Reader) (*http.Response, error) {
	u, token, err := c.filesURL(ctx, sessionID, path, query)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, unavailable(err, "files endpoint: %v", err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
	out := &Error{Type: e.Error.Type, Message: e.Error.Message}
	for _, k := range boxerr.Kinds {
		if k.Type == e.Error.Type {
			out.Code, out.Retryable = k.Code, k.Retryable
		}
	}
	if out.Message == "" {
		out.Message = fmt.Sprintf("files endpoint: HTTP %d", resp.StatusCode)
	}
	return nil, out
}

// Download streams path into w and returns the byte count.
func (c *Client) Download(ctx context.Context, sessionID, path string, w io.Writer) (int64, error) {
	resp, err := c.doFiles(ctx, http.MethodGet, sessionID, path, url.Values{}, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("reconnect: download of %s ended after %d of %d bytes", path, n, resp.ContentLength)
	}
	return n, err
}

// Upload streams r to path (parents created, replaced atomically once
// complete; mode 0 keeps an existing file's mode, else 0644) and returns
// the byte count the runtime stored.
func (c *Client) Upload(ctx context.Context, sessionID, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	q := url.Values{}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode.Perm()), 8))
	}
	resp, err := c.doFiles(ctx, http.MethodPut, sessionID, path, q, r)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		BytesWritten int64 `json:"bytes_written"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("reconnect: upload answer: %w", err)
	}
	return out.BytesWritten, nil
}
