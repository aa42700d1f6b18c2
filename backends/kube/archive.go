package kube

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.Archiver = (*Backend)(nil)

// errImportDone ends the feeding of an import whose tar has exited.
var errImportDone = errors.New("import ended")

// ExportFiles implements backends.Archiver: the workspace and /tmp, as
// `tar -c` run in the Pod writes them, renamed under
// backends.ArchiveWorkspace and backends.ArchiveTmp. A writable root
// filesystem's changes are the Pod's and are not kept (a suspension loses
// them too). A host_path workspace (a mapped claim) is read only when
// opts.HostPaths allows it. A suspended session gets a Pod on its claims
// for the time of the export.
func (b *Backend) ExportFiles(ctx context.Context, info backends.Session, opts backends.ExportOptions, w io.Writer) error {
	if b.configErr != nil {
		return b.configErr
	}
	tw := tar.NewWriter(w)
	if info.State == backends.StateSuspended {
		pvc, err := b.suspendedClaim(ctx, info)
		if err != nil {
			return err
		}
		if pvc.Annotations[AnnSuspended] != "" {
			if _, err := b.podFromClaim(ctx, pvc); err != nil {
				return err
			}
			defer func() {
				b.deletePodOnly(ctx, info.BackendSessionID)
				wctx, cancel := cleanupContext(ctx, goneTimeout)
				defer cancel()
				_ = b.waitGone(wctx, info.BackendSessionID)
			}()
		}
	}
	if !info.HostWorkspace() || opts.HostPaths {
		if err := b.exportDir(ctx, info, tw, mountPath(info), backends.ArchiveWorkspace, underAny(mountsBelow(info))); err != nil {
			return err
		}
	}
	if ownTmp(info) {
		if err := b.exportDir(ctx, info, tw, "/tmp", backends.ArchiveTmp, legacyPidFile); err != nil {
			return err
		}
	}
	return tw.Close()
}

// legacyPidFile reports whether rel, in /tmp, is the pid file of an exec
// or process of a Pod an earlier boxrt made (pidDirOf), which is not the
// user's. (busybox tar has no --exclude.)
func legacyPidFile(rel string) bool {
	return !strings.Contains(rel, "/") && strings.HasPrefix(rel, ".boxrt-") && strings.HasSuffix(rel, ".pid")
}

// underAny reports whether rel is one of dirs or below one: the extra
// mounts a workspace export leaves out. They are dropped as the stream
// arrives because busybox tar, the smallest images' only tar, has no
// --exclude.
func underAny(dirs []string) func(rel string) bool {
	return func(rel string) bool {
		for _, d := range dirs {
			if rel == d || strings.HasPrefix(rel, d+"/") {
				return true
			}
		}
		return false
	}
}

// exportDir writes dir of the session's Pod to tw, its entries renamed
// under prefix, leaving out those whose path relative to dir skip (when
// set) reports.
func (b *Backend) exportDir(ctx context.Context, info backends.Session, tw *tar.Writer, dir, prefix string, skip func(rel string) bool) error {
	run, err := fsRunner{b}.Run(ctx, info, nil, []string{"tar", "-C", dir, "-cf", "-", "."})
	if err != nil {
		return err
	}
	rename := func(n string) string {
		n = strings.TrimPrefix(path.Clean("/"+n), "/")
		if n == "" || skip != nil && skip(n) {
			return ""
		}
		return prefix + n
	}
	cerr := copyRenamed(tw, tar.NewReader(run.Stdout()), rename, nil)
	if cerr != nil {
		run.Cancel()
	}
	code, stderr, werr := run.Wait()
	if err := firstErr(werr, cerr); err != nil {
		return boxerr.Failure("kube backend: exporting %s of session %s: %v", dir, info.SessionID, err).Wrap(err)
	}
	if code != 0 {
		return boxerr.Failure("kube backend: exporting %s of session %s: tar exited %d: %s", dir, info.SessionID, code, stderr)
	}
	return nil
}

// copyRenamed copies every entry of tr to tw under rename's name (an empty
// name drops the entry; hard link targets are renamed alike). check, when
// set, sees each entry first and ends the copy with its error; entries no
// export keeps (backends.Archivable) are dropped.
func copyRenamed(tw *tar.Writer, tr *tar.Reader, rename func(string) string, check func(*tar.Header) error) error {
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err == nil && check != nil {
			err = check(hdr)
		}
		if err != nil {
			return err
		}
		n := rename(hdr.Name)
		if n == "" || !backends.Archivable(hdr) {
			continue
		}
		if hdr.Typeflag == tar.TypeLink {
			if hdr.Linkname = rename(hdr.Linkname); hdr.Linkname == "" {
				continue
			}
		}
		if hdr.Typeflag == tar.TypeDir {
			n += "/"
		}
		hdr.Name = n
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// ImportFiles implements backends.Archiver: the workspace/ and tmp/
// entries are streamed into one `tar -x` run in the Pod at /, below the
// mount path and /tmp, as the sandbox user (owners are not kept). Entries
// of any other part (a docker or bwrap archive's rootfs/, home/) are
// refused, and so are tmp/ entries for a session without a /tmp of its
// own; every entry passes an EntryGuard first (hard links allowed: tar
// makes them inside the Pod, below the same places).
func (b *Backend) ImportFiles(ctx context.Context, info backends.Session, r io.Reader) error {
	if b.configErr != nil {
		return b.configErr
	}
	pr, pw := io.Pipe()
	run, err := fsRunner{b}.Run(ctx, info, pr, []string{"tar", "-C", "/", "-xf", "-"})
	if err != nil {
		return err
	}
	feedErr := make(chan error, 1)
	go func() {
		tw := tar.NewWriter(pw)
		var bad error
		parts := importParts(info)
		rename := func(n string) string {
			to, ok := parts.place(n)
			if !ok && bad == nil {
				bad = boxerr.Validation("snapshot", "the kube backend cannot take archive entry %q (only %s are restored)", n, parts)
			}
			return to
		}
		err := copyRenamed(tw, tar.NewReader(r), rename, importCheck(info))
		err = firstErr(bad, err, tw.Close())
		pw.CloseWithError(err)
		feedErr <- err
	}()
	code, stderr, werr := run.Wait()
	pr.CloseWithError(errImportDone)
	ferr := <-feedErr
	if errors.Is(ferr, errImportDone) || errors.Is(ferr, io.ErrClosedPipe) {
		ferr = nil
	}
	var be *boxerr.Error
	if errors.As(ferr, &be) {
		return be
	}
	if err := firstErr(ferr, werr); err != nil {
		return boxerr.Failure("kube backend: restoring the files of session %s: %v", info.SessionID, err).Wrap(err)
	}
	if code != 0 {
		return boxerr.Failure("kube backend: restoring the files of session %s: tar exited %d: %s", info.SessionID, code, stderr)
	}
	return nil
}

// archiveParts maps an archive's top-level parts to the Pod directories
// they are restored into.
type archiveParts map[string]string

func importParts(info backends.Session) archiveParts {
	parts := archiveParts{backends.ArchiveWorkspace: mountPath(info)}
	if ownTmp(info) {
		parts[backends.ArchiveTmp] = "/tmp"
	}
	return parts
}

// place is where entry n goes, relative to / ("" for a part's own
// directory, which is left as it is); ok is false for an entry of no part.
func (p archiveParts) place(n string) (to string, ok bool) {
	for prefix, dir := range p {
		if rest, in := strings.CutPrefix(n, prefix); in || strings.TrimSuffix(n, "/")+"/" == prefix {
			rest = strings.TrimPrefix(path.Clean("/"+rest), "/")
			if rest == "" {
				return "", true
			}
			return strings.TrimPrefix(path.Join(dir, rest), "/"), true
		}
	}
	return "", false
}

func (p archiveParts) String() string {
	names := make([]string, 0, len(p))
	for prefix := range p {
		names = append(names, prefix)
	}
	sort.Strings(names)
	return strings.Join(names, " and ")
}

// importCheck guards each entry of an import and refuses those in an
// extra mount below the workspace, which a restore never writes.
func importCheck(info backends.Session) func(*tar.Header) error {
	guard := backends.EntryGuard{HardLinks: true}
	below := mountsBelow(info)
	return func(hdr *tar.Header) error {
		if err := guard.Check(hdr); err != nil {
			return err
		}
		rest, ok := strings.CutPrefix(strings.TrimSuffix(hdr.Name, "/"), backends.ArchiveWorkspace)
		if !ok {
			return nil
		}
		for _, rel := range below {
			if rest == rel || strings.HasPrefix(rest, rel+"/") {
				return backends.RefuseEntry(hdr.Name, "it lies in an extra mount, which a restore never writes")
			}
		}
		return nil
	}
}

// mountsBelow are the extra mounts inside the workspace, relative to it:
// the Pod's tar would see them as part of it, but they are never part of
// a snapshot, on export or restore.
func mountsBelow(info backends.Session) []string {
	var out []string
	ws := path.Clean(mountPath(info))
	for _, m := range info.ExtraMounts {
		if rel, ok := strings.CutPrefix(path.Clean(m.MountPath), ws+"/"); ok {
			out = append(out, rel)
		}
	}
	return out
}

func mountPath(info backends.Session) string {
	if info.MountPath == "" {
		return backends.DefaultMountPath
	}
	return info.MountPath
}
