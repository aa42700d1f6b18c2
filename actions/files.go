package actions

import (
	"context"
	"encoding/base64"
	"io"
	"io/fs"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

// The file methods (box_fs_*): a session's files by sandbox path. Data
// travels base64-encoded and at most runtime.MaxRPCFileBytes per call;
// the files endpoint streams larger ones.

// A path is "path", or "path_base64" for a name that is not UTF-8 (JSON
// strings cannot carry such bytes).
type fsPathParams struct {
	SessionID  string `json:"session_id"`
	Path       string `json:"path"`
	PathBase64 string `json:"path_base64"`
}

func (p *fsPathParams) validate() error {
	if strings.TrimSpace(p.SessionID) == "" {
		return boxerr.Validation("session_id", "session_id is required")
	}
	return pathParam("path", &p.Path, p.PathBase64)
}

// pathParam settles a path given as field or field_base64 (exactly one).
func pathParam(field string, p *string, b64 string) error {
	switch {
	case *p != "" && b64 != "":
		return boxerr.Validation(field, "give %s or %s_base64, not both", field, field)
	case b64 != "":
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return boxerr.Validation(field+"_base64", "%s_base64 is not standard base64: %v", field, err)
		}
		*p = string(raw)
	}
	if *p == "" {
		return boxerr.Validation(field, "%s is required", field)
	}
	return nil
}

type fsReadParams struct {
	fsPathParams
	Offset int64  `json:"offset"`
	Length *int64 `json:"length"`
}

func (p *fsReadParams) validate() error {
	if err := p.fsPathParams.validate(); err != nil {
		return err
	}
	if p.Length != nil && (*p.Length < 0 || *p.Length > runtime.MaxRPCFileBytes) {
		if *p.Length < 0 {
			return boxerr.Validation("length", "length must not be negative, got %d", *p.Length)
		}
		return runtime.TooLargeForRPC("length", *p.Length)
	}
	return nil
}

type fsReadResult struct {
	DataBase64 string `json:"data_base64"`
	Size       int64  `json:"size"`
	EOF        bool   `json:"eof"`
}

// fsRead: box_fs_read {"session_id", "path", "offset"=0, "length"} →
// {"data_base64", "size" (the file's), "eof"}. Without length, the rest of
// the file, refused when above the RPC limit.
func (d *Dispatcher) fsRead(ctx context.Context, p fsReadParams) (fsReadResult, error) {
	length := int64(-1)
	if p.Length != nil {
		length = *p.Length
	}
	rc, fi, err := d.rt.Files().Read(ctx, p.SessionID, p.Path, p.Offset, length)
	if err != nil {
		return fsReadResult{}, err
	}
	defer rc.Close()
	want := max(fi.Size-p.Offset, 0)
	if length >= 0 {
		want = min(want, length)
	} else if want > runtime.MaxRPCFileBytes {
		return fsReadResult{}, runtime.TooLargeForRPC("path", want)
	}
	buf := make([]byte, want)
	n, err := io.ReadFull(rc, buf)
	if err != nil && err != io.ErrUnexpectedEOF {
		return fsReadResult{}, backends.FileError("path", p.Path, err)
	}
	return fsReadResult{DataBase64: base64.StdEncoding.EncodeToString(buf[:n]), Size: fi.Size,
		EOF: p.Offset+int64(n) >= fi.Size}, nil
}

type fsWriteParams struct {
	fsPathParams
	DataBase64 string  `json:"data_base64"`
	Mode       *uint32 `json:"mode"`
	Append     bool    `json:"append"`
}

type fsWriteResult struct {
	Path         string `json:"path"`
	BytesWritten int64  `json:"bytes_written"`
}

// fsWrite: box_fs_write {"session_id", "path", "data_base64", "mode",
// "append"=false} → {"path", "bytes_written"}. Parents are created; the
// file is replaced atomically unless append.
func (d *Dispatcher) fsWrite(ctx context.Context, p fsWriteParams) (fsWriteResult, error) {
	if n := int64(base64.StdEncoding.DecodedLen(len(p.DataBase64))); n > runtime.MaxRPCFileBytes+2 {
		return fsWriteResult{}, runtime.TooLargeForRPC("data_base64", n)
	}
	data, err := base64.StdEncoding.DecodeString(p.DataBase64)
	if err != nil {
		return fsWriteResult{}, boxerr.Validation("data_base64", "data_base64 is not standard base64: %v", err)
	}
	if len(data) > runtime.MaxRPCFileBytes {
		return fsWriteResult{}, runtime.TooLargeForRPC("data_base64", int64(len(data)))
	}
	opts := backends.WriteOptions{Append: p.Append}
	if p.Mode != nil {
		if *p.Mode == 0 || *p.Mode > 0o777 {
			return fsWriteResult{}, boxerr.Validation("mode", "mode must be permission bits between 1 and 0o777 (511), got %d", *p.Mode)
		}
		opts.Mode = fs.FileMode(*p.Mode)
	}
	n, err := d.rt.Files().Write(ctx, p.SessionID, p.Path, strings.NewReader(string(data)), opts)
	return fsWriteResult{Path: p.Path, BytesWritten: n}, err
}

type fsListParams struct {
	fsPathParams
	Depth int `json:"depth"`
}

func (p *fsListParams) setDefaults() { p.Depth = 1 }

type fsListResult struct {
	Entries   []backends.FileInfo `json:"entries"`
	Truncated bool                `json:"truncated"`
}

// fsList: box_fs_list {"session_id", "path", "depth"=1} → {"entries":
// [{name, path, type, size, mode, mtime}], "truncated"}.
func (d *Dispatcher) fsList(ctx context.Context, p fsListParams) (fsListResult, error) {
	entries, cut, err := d.rt.Files().List(ctx, p.SessionID, p.Path, p.Depth)
	if entries == nil {
		entries = []backends.FileInfo{}
	}
	for i := range entries {
		entries[i] = entries[i].Encoded()
	}
	return fsListResult{Entries: entries, Truncated: cut}, err
}

// fsStat: box_fs_stat {"session_id", "path"} → {name, path, type, size,
// mode, mtime} of the path itself (a symlink is reported as one).
func (d *Dispatcher) fsStat(ctx context.Context, p fsPathParams) (backends.FileInfo, error) {
	fi, err := d.rt.Files().Stat(ctx, p.SessionID, p.Path)
	return fi.Encoded(), err
}

type fsRemoveParams struct {
	fsPathParams
	Recursive bool `json:"recursive"`
}

// fsRemove: box_fs_remove {"session_id", "path", "recursive"=false} → {}.
func (d *Dispatcher) fsRemove(ctx context.Context, p fsRemoveParams) (struct{}, error) {
	return struct{}{}, d.rt.Files().Remove(ctx, p.SessionID, p.Path, p.Recursive)
}

// fsMkdir: box_fs_mkdir {"session_id", "path"} → {} (parents included;
// an existing directory is fine).
func (d *Dispatcher) fsMkdir(ctx context.Context, p fsPathParams) (struct{}, error) {
	return struct{}{}, d.rt.Files().Mkdir(ctx, p.SessionID, p.Path)
}

type fsRenameParams struct {
	SessionID  string `json:"session_id"`
	From       string `json:"from"`
	FromBase64 string `json:"from_base64"`
	To         string `json:"to"`
	ToBase64   string `json:"to_base64"`
}

func (p *fsRenameParams) validate() error {
	if strings.TrimSpace(p.SessionID) == "" {
		return boxerr.Validation("session_id", "session_id is required")
	}
	if err := pathParam("from", &p.From, p.FromBase64); err != nil {
		return err
	}
	return pathParam("to", &p.To, p.ToBase64)
}

// fsRename: box_fs_rename {"session_id", "from", "to"} → {}.
func (d *Dispatcher) fsRename(ctx context.Context, p fsRenameParams) (struct{}, error) {
	return struct{}{}, d.rt.Files().Rename(ctx, p.SessionID, p.From, p.To)
}
