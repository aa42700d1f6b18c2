package runtime

import (
	"context"
	"io"
	"sort"
	"sync"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// FileSystem is the file API a backend may serve: a session's files as
// its sandbox sees them (see backends/files.go for the path rules every
// implementation keeps). The runtime checks paths for form, finds the
// session and keeps it from being reaped while a call runs; the backend
// resolves each path inside the sandbox's own view.
type FileSystem interface {
	StatFile(ctx context.Context, info backends.Session, path string) (backends.FileInfo, error)
	// ListFiles returns the entries below dir down to depth levels (1: its
	// children), at most limit of them (more means the listing was cut).
	ListFiles(ctx context.Context, info backends.Session, dir string, depth, limit int) ([]backends.FileInfo, error)
	// ReadFile opens a regular file for reading from offset, at most
	// length bytes (negative: to the end). The FileInfo is the file's.
	ReadFile(ctx context.Context, info backends.Session, path string, offset, length int64) (io.ReadCloser, backends.FileInfo, error)
	// WriteFile stores everything r yields at path, creating missing
	// parent directories. Unless opts.Append, the file is written under
	// a temporary name and renamed over path once r is drained, so a
	// failed upload leaves the old file (or none) in place.
	WriteFile(ctx context.Context, info backends.Session, path string, r io.Reader, opts backends.WriteOptions) (int64, error)
	RemoveFile(ctx context.Context, info backends.Session, path string, recursive bool) error
	// MakeDir creates path and its missing parents.
	MakeDir(ctx context.Context, info backends.Session, path string) error
	RenameFile(ctx context.Context, info backends.Session, from, to string) error
}

// MaxListEntries bounds one box_fs_list result.
const MaxListEntries = 10000

// Files is the file API of the sessions. It holds no state of its own:
// a call finds its session in the table and keeps it busy (the reaper and
// suspend spare it) while the backend serves the call.
type Files struct{ r *Runtime }

// session finds the session for a file call, resumed if it was suspended,
// and marks it busy until release is called; the backend must serve the
// file API.
func (f *Files) session(ctx context.Context, sessionID string) (FileSystem, backends.Session, func(), error) {
	r := f.r
	sessionID, err := resolve(ctx, sessionID)
	if err != nil {
		return nil, backends.Session{}, nil, err
	}
	s := r.sessions.get(sessionID)
	if s == nil {
		return nil, backends.Session{}, nil, boxerr.SessionNotFound(sessionID)
	}
	b := r.backends.current()
	if b == nil {
		return nil, backends.Session{}, nil, boxerr.SessionNotFound(sessionID).With("reason", "being deleted")
	}
	fsys, ok := b.(FileSystem)
	if !ok {
		return nil, backends.Session{}, nil, boxerr.Failure("the %s backend has no file API", b.Name())
	}
	// A suspended session's files are not reachable (docker: its container
	// is stopped; bwrap: its disk is unmounted): it is resumed first. Once
	// it is marked busy, nothing suspends it under the call.
	for {
		info, suspended, err := r.sessions.markBusy(s)
		if err != nil {
			return nil, backends.Session{}, nil, err
		}
		if !suspended {
			var once sync.Once
			release := func() { once.Do(func() { r.sessions.releaseExec(s) }) }
			return fsys, info, release, nil
		}
		if _, err := r.resumeSession(ctx, sessionID); err != nil {
			return nil, backends.Session{}, nil, err
		}
	}
}

// withFiles runs fn on the session's file API with path checked.
func withFiles[T any](ctx context.Context, f *Files, sessionID, path string, fn func(FileSystem, backends.Session, string) (T, error)) (T, error) {
	var zero T
	p, err := backends.CheckSandboxPath("path", path)
	if err != nil {
		return zero, err
	}
	fsys, info, release, err := f.session(ctx, sessionID)
	if err != nil {
		return zero, err
	}
	defer release()
	return fn(fsys, info, p)
}

// Stat describes one path (a symlink itself, not its target).
func (f *Files) Stat(ctx context.Context, sessionID, path string) (backends.FileInfo, error) {
	return withFiles(ctx, f, sessionID, path, func(fsys FileSystem, info backends.Session, p string) (backends.FileInfo, error) {
		return fsys.StatFile(ctx, info, p)
	})
}

// List lists a directory down to depth levels (1..MaxListDepth) and
// reports whether the listing was cut at MaxListEntries.
func (f *Files) List(ctx context.Context, sessionID, path string, depth int) ([]backends.FileInfo, bool, error) {
	if depth < 1 || depth > backends.MaxListDepth {
		return nil, false, boxerr.Validation("depth", "depth must be between 1 and %d, got %d", backends.MaxListDepth, depth)
	}
	entries, err := withFiles(ctx, f, sessionID, path, func(fsys FileSystem, info backends.Session, p string) ([]backends.FileInfo, error) {
		return fsys.ListFiles(ctx, info, p, depth, MaxListEntries+1)
	})
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	if len(entries) > MaxListEntries {
		return entries[:MaxListEntries], true, err
	}
	return entries, false, err
}

// Read opens a file for streaming; the session stays busy until the
// reader is closed.
func (f *Files) Read(ctx context.Context, sessionID, path string, offset, length int64) (io.ReadCloser, backends.FileInfo, error) {
	if offset < 0 {
		return nil, backends.FileInfo{}, boxerr.Validation("offset", "offset must not be negative, got %d", offset)
	}
	p, err := backends.CheckSandboxPath("path", path)
	if err != nil {
		return nil, backends.FileInfo{}, err
	}
	fsys, info, release, err := f.session(ctx, sessionID)
	if err != nil {
		return nil, backends.FileInfo{}, err
	}
	rc, fi, err := fsys.ReadFile(ctx, info, p, offset, length)
	if err != nil {
		release()
		return nil, fi, err
	}
	return &releasingReader{ReadCloser: rc, release: release}, fi, nil
}

type releasingReader struct {
	io.ReadCloser
	release func()
}

func (rr *releasingReader) Close() error {
	defer rr.release()
	return rr.ReadCloser.Close()
}

// Write stores what src yields at path and returns the byte count.
func (f *Files) Write(ctx context.Context, sessionID, path string, src io.Reader, opts backends.WriteOptions) (int64, error) {
	if opts.Mode&^0o777 != 0 {
		return 0, boxerr.Validation("mode", "mode must be permission bits (at most 0o777, i.e. 511), got %#o", uint32(opts.Mode))
	}
	return withFiles(ctx, f, sessionID, path, func(fsys FileSystem, info backends.Session, p string) (int64, error) {
		return fsys.WriteFile(ctx, info, p, src, opts)
	})
}

// Remove removes a file or an empty directory; with recursive, a
// directory and everything below it.
func (f *Files) Remove(ctx context.Context, sessionID, path string, recursive bool) error {
	_, err := withFiles(ctx, f, sessionID, path, func(fsys FileSystem, info backends.Session, p string) (struct{}, error) {
		return struct{}{}, fsys.RemoveFile(ctx, info, p, recursive)
	})
	return err
}

// Mkdir creates a directory and its missing parents.
func (f *Files) Mkdir(ctx context.Context, sessionID, path string) error {
	_, err := withFiles(ctx, f, sessionID, path, func(fsys FileSystem, info backends.Session, p string) (struct{}, error) {
		return struct{}{}, fsys.MakeDir(ctx, info, p)
	})
	return err
}

// Rename renames from to to (both in the session).
func (f *Files) Rename(ctx context.Context, sessionID, from, to string) error {
	dst, err := backends.CheckSandboxPath("to", to)
	if err != nil {
		return err
	}
	src, err := backends.CheckSandboxPath("from", from)
	if err != nil {
		return err
	}
	_, err = withFiles(ctx, f, sessionID, src, func(fsys FileSystem, info backends.Session, p string) (struct{}, error) {
		return struct{}{}, fsys.RenameFile(ctx, info, p, dst)
	})
	return err
}

// MaxRPCFileBytes bounds the data one box_fs_read returns or one
// box_fs_write carries (before base64, which adds a third): larger files
// go through the files endpoint, which streams.
const MaxRPCFileBytes = 8 << 20

// FilesEndpoint is the HTTP route of a session's files (GET and PUT,
// ?path=…), served next to the relay.
const FilesEndpoint = "/v1/sessions/{session_id}/files"

// TooLargeForRPC is the refusal of an RPC file transfer above
// MaxRPCFileBytes; it names the endpoint to use instead.
func TooLargeForRPC(field string, size int64) *boxerr.Error {
	return boxerr.Validation(field, "%s: %d bytes exceed the %d-byte limit of a box_fs_* call; use GET/PUT %s?path=… (streams any size) or read in ranges with offset/length",
		field, size, MaxRPCFileBytes, FilesEndpoint).
		With("limit", MaxRPCFileBytes).With("http_endpoint", FilesEndpoint)
}
