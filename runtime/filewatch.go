package runtime

import (
	"context"
	"sort"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// File watches poll: each Poll lists the directory through the session's
// FileSystem (so the watch sees exactly what box_fs_list sees, with the
// same path rules, on every backend) and compares the listing with the
// previous one. A sandbox's changes reach no host notification API we
// could rely on across backends — docker's happen inside a container,
// bwrap's on mounts the sandbox may replace — while a listing is cheap
// and bounded (MaxListEntries).

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
	r         *Runtime
	sessionID string
	path      string
	depth     int
	last      map[string]backends.FileInfo
	// scope is the namespace the watch was made in: its polls run on the
	// connection's context, which carries none.
	scope func(context.Context) context.Context
}

// WatchFiles takes the first listing of dir (which must list completely:
// a directory with more than MaxListEntries entries down to depth is
// refused) and returns the watch.
func (r *Runtime) WatchFiles(ctx context.Context, sessionID, dir string, depth int) (*FileWatch, error) {
	w := &FileWatch{r: r, sessionID: sessionID, path: dir, depth: depth, scope: func(c context.Context) context.Context { return c }}
	if p, ok := tenant.FromContext(ctx); ok {
		w.scope = func(c context.Context) context.Context { return tenant.WithPlacement(c, p) }
	}
	snap, err := w.list(ctx)
	if err != nil {
		return nil, err
	}
	w.last = snap
	return w, nil
}

func (w *FileWatch) list(ctx context.Context) (map[string]backends.FileInfo, error) {
	entries, cut, err := w.r.FileList(w.scope(ctx), w.sessionID, w.path, w.depth)
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
	return snap, nil
}

// Poll lists the directory again and returns what changed since the last
// poll, sorted by path. Its errors are FileList's: a session or directory
// that is gone ends the watch (BoxSessionNotFoundError,
// BoxFileNotFoundError).
func (w *FileWatch) Poll(ctx context.Context) ([]FileEvent, error) {
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
