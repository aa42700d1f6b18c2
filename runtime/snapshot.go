package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/snapshots"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// Snapshots is the snapshot service: snapshots of a session's files,
// sessions restored from them, and forks. It owns the snapshot stores,
// cached per configured location, so a store's temp-file cleanup (at
// open) never races a Put of the same store.
type Snapshots struct {
	r *Runtime

	mu     sync.Mutex
	byDir  map[string]*snapshots.Local
	custom snapshots.Store // WithSnapshotStore
}

// WithSnapshotStore replaces the local directory store (an object store,
// tests).
func WithSnapshotStore(s snapshots.Store) Option {
	return func(r *Runtime) { r.snapStore = s }
}

// store returns the store the configuration names.
func (sn *Snapshots) store() (snapshots.Store, error) {
	cfg := sn.r.Config().Durable
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.custom != nil {
		return sn.custom, nil
	}
	dir := sn.dir(cfg)
	max := int64(cfg.SnapshotMaxTotalMB) << 20
	if st := sn.byDir[dir]; st != nil {
		st.SetMaxBytes(max)
		return st, nil
	}
	st, err := snapshots.OpenLocal(dir, max)
	if err != nil {
		return nil, err
	}
	if sn.byDir == nil {
		sn.byDir = map[string]*snapshots.Local{}
	}
	sn.byDir[dir] = st
	return st, nil
}

func (sn *Snapshots) dir(cfg Durable) string {
	if cfg.SnapshotDir != "" {
		return cfg.SnapshotDir
	}
	return filepath.Join(sn.r.stateDir, "snapshots")
}

// tidy opens the local store at start when it exists, so what a crash
// mid-snapshot left (temp files, an archive no manifest names) is removed
// now rather than at the first snapshot call; a store that does not exist
// yet is not made.
func (sn *Snapshots) tidy() {
	if _, err := os.Stat(sn.dir(sn.r.Config().Durable)); err != nil {
		return
	}
	if _, err := sn.store(); err != nil {
		sn.r.log.Warn().Err(err).Msg("snapshot store: cannot open it to remove what a crash left")
	}
}

// archiver returns the backend's Archiver or a typed error naming it.
func archiver(b backends.Backend) (backends.Archiver, error) {
	a, ok := b.(backends.Archiver)
	if !ok {
		return nil, boxerr.Failure("the %s backend cannot snapshot sessions", b.Name()).With("backend", b.Name())
	}
	return a, nil
}

// hostWorkspace reports whether a session's workspace is a host directory.
func hostWorkspace(sb backends.Sandbox) bool {
	return sb.HostPath != "" && sb.HostPathMode != backends.MountNone
}

// exportOptions applies the host-path rule: a host_path workspace is
// copied only when durable.snapshot_host_paths allows it; extra mounts and
// skills never are. notes say what was left out.
func exportOptions(cfg Durable, sb backends.Sandbox) (opts backends.ExportOptions, notes []string) {
	opts.HostPaths = cfg.SnapshotHostPaths
	if hostWorkspace(sb) && !opts.HostPaths {
		notes = append(notes, fmt.Sprintf("host_path %s is not copied (durable.snapshot_host_paths is off): a restore binds it again", sb.HostPath))
	}
	if len(sb.ExtraMounts) > 0 {
		notes = append(notes, "extra mounts are never copied: a restore binds them again")
	}
	return opts, notes
}

// pipeExport runs the backend's export into a pipe and hands its reader to
// consume; the export's error wins over consume's, which is usually only
// its consequence, unless the export only failed because consume stopped
// reading.
func pipeExport(ctx context.Context, a backends.Archiver, info backends.Session, opts backends.ExportOptions,
	consume func(io.Reader) error) error {
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := a.ExportFiles(ctx, info, opts, pw)
		pw.CloseWithError(err)
		errc <- err
	}()
	cerr := consume(pr)
	pr.CloseWithError(io.ErrClosedPipe) // unblocks an export consume gave up on
	if err := <-errc; err != nil && (cerr == nil || !errors.Is(err, io.ErrClosedPipe)) {
		return err
	}
	return cerr
}

// Take saves a running or suspended session's files to the
// snapshot store. Mode full (memory and processes) answers the reason it
// is not available (checkpoint.go).
func (sn *Snapshots) Take(ctx context.Context, id, mode string) (snapshots.Manifest, error) {
	switch mode {
	case "", snapshots.ModeFilesystem:
		mode = snapshots.ModeFilesystem
	case snapshots.ModeFull:
		return snapshots.Manifest{}, fullSnapshotUnavailable(ctx)
	default:
		return snapshots.Manifest{}, boxerr.Validation("mode", "mode must be %q or %q, got %q", snapshots.ModeFilesystem, snapshots.ModeFull, mode)
	}
	r := sn.r
	b, err := r.backends.ensure(ctx)
	if err != nil {
		return snapshots.Manifest{}, err
	}
	a, err := archiver(b)
	if err != nil {
		return snapshots.Manifest{}, err
	}
	store, err := sn.store()
	if err != nil {
		return snapshots.Manifest{}, err
	}
	if id, err = resolve(ctx, id); err != nil {
		return snapshots.Manifest{}, err
	}
	var m snapshots.Manifest
	start := time.Now()
	// The id lock keeps suspend, resume and destruction out while the
	// files are read; execs already running go on.
	err = r.sessions.underLive(id, func(s *session) error {
		m, err = sn.export(ctx, a, store, b.Name(), mode, r.sessions.info(s))
		return err
	})
	if err != nil {
		return snapshots.Manifest{}, err
	}
	r.log.Info().Str("session_id", id).Str("snapshot_id", m.ID).Int64("bytes", m.SizeBytes).
		Dur("took", time.Since(start)).Msg("session snapshot stored")
	return m, nil
}

// export stores the files of the session info in store.
func (sn *Snapshots) export(ctx context.Context, a backends.Archiver, store snapshots.Store, backend, mode string, info backends.Session) (snapshots.Manifest, error) {
	spec, err := json.Marshal(info.Sandbox)
	if err != nil {
		return snapshots.Manifest{}, err
	}
	opts, notes := exportOptions(sn.r.Config().Durable, info.Sandbox)
	m := snapshots.Manifest{SessionID: info.SessionID, Backend: backend, Mode: mode, Spec: spec, Notes: notes,
		HostPathIncluded: hostWorkspace(info.Sandbox) && opts.HostPaths}
	err = pipeExport(ctx, a, info, opts, func(rd io.Reader) error {
		m, err = store.Put(ctx, m, rd)
		return err
	})
	return m, err
}

// List returns the snapshots of ctx's Workspace (every one in
// the default namespace but the Workspaces'), oldest first.
func (sn *Snapshots) List(ctx context.Context) ([]snapshots.Manifest, error) {
	store, err := sn.store()
	if err != nil {
		return nil, err
	}
	all, err := store.List(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(m snapshots.Manifest) bool { return !tenant.VisibleWorkspace(ctx, m.SessionID) }), nil
}

// Get returns one snapshot's manifest.
func (sn *Snapshots) Get(ctx context.Context, id string) (snapshots.Manifest, error) {
	store, err := sn.store()
	if err != nil {
		return snapshots.Manifest{}, err
	}
	return snapshotIn(ctx, store, strings.TrimSpace(id))
}

// Delete removes a snapshot.
func (sn *Snapshots) Delete(ctx context.Context, id string) error {
	store, err := sn.store()
	if err != nil {
		return err
	}
	id = strings.TrimSpace(id)
	if _, err := snapshotIn(ctx, store, id); err != nil {
		return err
	}
	return store.Delete(ctx, id)
}

// restoreSpec turns a spec naming from_snapshot into the snapshot's
// sandbox (same image, limits, mounts) with a restore of its files. The
// snapshot must come from this backend. A snapshot that copied its
// host_path workspace restores into a workspace of the session's own.
func (sn *Snapshots) restoreSpec(ctx context.Context, b backends.Backend, spec Spec) (Spec, error) {
	if sn.r.sessions.get(spec.SessionID) != nil {
		return spec, nil // an existing session ignores from_snapshot
	}
	store, err := sn.store()
	if err != nil {
		return spec, err
	}
	m, err := snapshotIn(ctx, store, spec.FromSnapshot)
	if err != nil {
		return spec, err
	}
	if m.Backend != b.Name() {
		return spec, boxerr.Validation("from_snapshot", "snapshot %s was taken on the %s backend; this runtime runs %s", m.ID, m.Backend, b.Name())
	}
	var sb backends.Sandbox
	if err := json.Unmarshal(m.Spec, &sb); err != nil {
		return spec, boxerr.SnapshotCorrupted(m.ID, "snapshot %s has an unreadable spec: %v", m.ID, err)
	}
	if m.HostPathIncluded {
		sb.HostPath = ""
	}
	spec.Sandbox = sb
	a, err := archiver(b)
	if err != nil {
		return spec, err
	}
	id := m.ID
	spec.restore = func(ctx context.Context, info backends.Session) error {
		_, rc, err := store.Open(ctx, id)
		if err != nil {
			return err
		}
		defer rc.Close()
		return snapshotError(id, a.ImportFiles(ctx, info, rc))
	}
	return spec, nil
}

// snapshotError names snapshot id in a refusal of its archive's content
// (the backend's EntryGuard does not know which snapshot it reads).
func snapshotError(id string, err error) error {
	var be *boxerr.Error
	if errors.As(err, &be) && errors.Is(be, boxerr.ErrSnapshotCorrupted) && be.Details["snapshot_id"] == "" {
		be.With("snapshot_id", id)
	}
	return err
}

// Fork makes newID an independent copy of session id (running or
// suspended): a new sandbox with the same spec (skills are not carried
// over: the host names them again), filled with a copy of the
// source's files streamed straight from one to the other (no store). The
// two share no writable file; a host_path workspace stays the host's
// directory, bound by both, unless durable.snapshot_host_paths makes the
// fork copy it into a workspace of its own.
func (sn *Snapshots) Fork(ctx context.Context, id, newID string) (SessionInfo, error) {
	r := sn.r
	id, err := resolve(ctx, id)
	if err != nil {
		return SessionInfo{}, err
	}
	if newID, err = tenant.Resolve(ctx, "new_session_id", newID); err != nil {
		return SessionInfo{}, err
	}
	b, err := r.backends.ensure(ctx)
	if err != nil {
		return SessionInfo{}, err
	}
	a, err := archiver(b)
	if err != nil {
		return SessionInfo{}, err
	}
	src, err := r.sessions.live(id)
	if err != nil {
		return SessionInfo{}, err
	}
	if r.sessions.get(newID) != nil {
		return SessionInfo{}, boxerr.Validation("new_session_id", "session %s already exists", newID)
	}
	var forked SessionInfo
	// The source's id lock holds suspend, resume and destruction off while
	// its files are read; the new id's is taken by acquire.
	r.sessions.underID(id, func() {
		forked, err = sn.fork(ctx, a, r.sessions.info(src), newID)
	})
	return forked, err
}

// fork makes newID a copy of the session info; the caller holds the
// source's id lock.
func (sn *Snapshots) fork(ctx context.Context, a backends.Archiver, info backends.Session, newID string) (SessionInfo, error) {
	r := sn.r
	opts, _ := exportOptions(r.Config().Durable, info.Sandbox)
	spec := DefaultSpec()
	spec.SessionID = newID
	spec.Sandbox = info.Sandbox
	if hostWorkspace(info.Sandbox) && opts.HostPaths {
		spec.HostPath = ""
	}
	spec.restore = func(ctx context.Context, dst backends.Session) error {
		return pipeExport(ctx, a, info, opts, func(rd io.Reader) error { return a.ImportFiles(ctx, dst, rd) })
	}
	start := time.Now()
	s, _, err := r.acquire(ctx, spec, false)
	if err != nil {
		return SessionInfo{}, err
	}
	r.log.Info().Str("session_id", info.SessionID).Str("new_session_id", newID).Dur("took", time.Since(start)).Msg("session forked")
	return SessionInfo{r.sessions.info(s)}, nil
}
