package runtime

import (
	"context"
	"sort"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// File watches poll: each Poll lists the directory through the session's
// FileSystem (so the watch sees exactly what box_fs_list sees, with the
// same path rules, on every backend) and compares the listing with the
// previous one. Where the backend's directories are host directories
// (bwrap's workspace, backends.HostDirs), inotify on them says whether
// anything changed, and a poll that heard of nothing lists nothing
// (dirnotify.go). Elsewhere — docker's changes happen inside a container
// — a listing is cheap enough and bounded (MaxListEntries).

// File event types.
const (
	FileCreated  = "created"
	FileModified = "modified"
	FileRemoved  = "removed"
)

// FileEvent is one change between two polls: what happened (Event) to
// the entry described by FileInfo (the last one seen, for a removal).
type FileEvent struct {
	Event string `json:"event"`
	backends.FileInfo
}

// FileWatch is a directory being watched. It is not safe for concurrent
// use: one poller owns it.
type FileWatch struct {
	files     *Files
	sessionID string
	path      string
	depth     int
	last      map[string]backends.FileInfo
	notify    *dirNotify // nil: every poll lists
	// scope is the namespace the watch was made in: its polls run on the
	// connection's context, which carries none.
	scope func(context.Context) context.Context
}

// Watch takes the first listing of dir (which must list completely:
// a directory with more than MaxListEntries entries down to depth is
// refused) and returns the watch.
func (f *Files) Watch(ctx context.Context, sessionID, dir string, depth int) (*FileWatch, error) {
	w := &FileWatch{files: f, sessionID: sessionID, path: dir, depth: depth, scope: func(c context.Context) context.Context { return c }}
	if p, ok := tenant.FromContext(ctx); ok {
		w.scope = func(c context.Context) context.Context { return tenant.WithPlacement(c, p) }
	}
	p, err := backends.CheckSandboxPath("path", dir)
	if err != nil {
		return nil, err
	}
	fsys, info, release, err := f.session(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	w.notify = newDirNotify(fsys, info, p)
	release()
	snap, err := w.list(ctx)
	if err != nil {
		w.Close()
		return nil, err
	}
	w.last = snap
	return w, nil
}

// Close releases what the watch holds (its inotify descriptor).
func (w *FileWatch) Close() {
	if w.notify != nil {
		w.notify.close()
		w.notify = nil
	}
}

func (w *FileWatch) list(ctx context.Context) (map[string]backends.FileInfo, error) {
	entries, cut, err := w.files.List(w.scope(ctx), w.sessionID, w.path, w.depth)
	if err != nil {
		return nil, err
	}
	if cut {
		return nil, boxerr.Validation("path", "%s holds more than %d entries down to depth %d: watch a smaller tree or a lower depth",
			w.path, MaxListEntries, w.depth).With("path", w.path)
	}
	snap := make(map[string]backends.FileInfo, len(entries))
	for _, e := range entries {
		snap[e.Path] = e
	}
	if w.notify != nil {
		w.notify.listed(snap, time.Now())
	}
	return snap, nil
}

// Entries is how many entries the last listing had: what one poll that
// lists costs.
func (w *FileWatch) Entries() int { return len(w.last) }

// Poll lists the directory again and returns what changed since the last
// poll, sorted by path. Its errors are Files.List's: a session or directory
// that is gone ends the watch (BoxSessionNotFoundError,
// BoxFileNotFoundError).
func (w *FileWatch) Poll(ctx context.Context) ([]FileEvent, error) {
	if w.notify != nil && w.notify.quiet(time.Now()) {
		// Nothing changed on the host side; the session must still be
		// there (a host_path outlives it).
		_, _, release, err := w.files.session(ctx, w.sessionID)
		if err != nil {
			return nil, err
		}
		release()
		return nil, nil
	}
	snap, err := w.list(ctx)
	if err != nil {
		return nil, err
	}
	var out []FileEvent
	for p, fi := range snap {
		old, ok := w.last[p]
		switch {
		case !ok:
			out = append(out, FileEvent{Event: FileCreated, FileInfo: fi})
		case old.Type != fi.Type || old.Size != fi.Size || old.Mode != fi.Mode || !old.MTime.Equal(fi.MTime):
			out = append(out, FileEvent{Event: FileModified, FileInfo: fi})
		}
	}
	for p, fi := range w.last {
		if _, ok := snap[p]; !ok {
			out = append(out, FileEvent{Event: FileRemoved, FileInfo: fi})
		}
	}
	w.last = snap
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}
