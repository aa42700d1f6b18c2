package bwrap

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.Archiver = (*Backend)(nil)

// storageRoots opens the session's workspace, tmp and home as os.Roots by
// archive prefix (the disk is mounted if a suspension unmounted it; done
// detaches it again). Everything below is read and written through the
// roots, never by a path a sandbox could redirect.
func (b *Backend) storageRoots(info backends.Session) (roots map[string]*os.Root, done func(), err error) {
	dir, err := b.lookup(info)
	if err != nil {
		return nil, nil, err
	}
	key := info.BackendSessionID
	ws, tmp, home, err := b.files(key).storage(b, dir)
	if err != nil {
		return nil, nil, boxerr.Failure("bwrap: session storage: %v", err).Wrap(err)
	}
	roots = map[string]*os.Root{}
	done = func() {
		for _, r := range roots {
			r.Close()
		}
		if info.State == backends.StateSuspended {
			_ = b.dropFiles(key)
		}
	}
	for prefix, f := range map[string]*os.File{backends.ArchiveWorkspace: ws, backends.ArchiveTmp: tmp, backends.ArchiveHome: home} {
		r, err := os.OpenRoot(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
		if err != nil {
			done()
			return nil, nil, boxerr.Failure("bwrap: session storage: %v", err).Wrap(err)
		}
		roots[prefix] = r
	}
	return roots, done, nil
}

// ExportFiles implements backends.Archiver: the session's workspace, /tmp
// and /home (its own disk). A host_path workspace is read, only when
// opts.HostPaths allows it, through the descriptor the session mounts
// (opened without following a symlink when the session first used it),
// never by its path: a directory swapped for a symlink since cannot make
// the export read what it points to. Extra mounts are never read.
func (b *Backend) ExportFiles(ctx context.Context, info backends.Session, opts backends.ExportOptions, w io.Writer) error {
	roots, done, err := b.storageRoots(info)
	if err != nil {
		return err
	}
	defer done()
	if info.HostWorkspace() {
		roots[backends.ArchiveWorkspace].Close()
		delete(roots, backends.ArchiveWorkspace)
		if opts.HostPaths {
			r, err := b.hostRoot(info)
			if err != nil {
				return err
			}
			roots[backends.ArchiveWorkspace] = r
		}
	}
	tw := tar.NewWriter(w)
	for _, prefix := range []string{backends.ArchiveWorkspace, backends.ArchiveTmp, backends.ArchiveHome} {
		if r := roots[prefix]; r != nil {
			if err := backends.WriteTree(ctx, tw, r, prefix); err != nil {
				return boxerr.Failure("bwrap: archiving session %s: %v", info.SessionID, err).Wrap(err)
			}
		}
	}
	return tw.Close()
}

// hostRoot opens the session's host_path workspace as an os.Root through
// the session's own descriptor of it (sessionFiles.hostDir, the one its
// sandboxes mount).
func (b *Backend) hostRoot(info backends.Session) (*os.Root, error) {
	f, err := b.files(info.BackendSessionID).hostDir(b, "host_path", info.HostPath, false, info.HostPathMode == backends.MountRW)
	if err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return nil, boxerr.Failure("bwrap: host_path %s: %v", info.HostPath, err).Wrap(err)
	}
	return r, nil
}

// ImportFiles implements backends.Archiver: workspace/, tmp/ and home/
// entries go to the session's own disk (never a host directory); rootfs/
// entries (a container's layer) have no place in a read-only bwrap root and
// are refused. Every entry passes an EntryGuard without hard links first.
func (b *Backend) ImportFiles(ctx context.Context, info backends.Session, r io.Reader) error {
	roots, done, err := b.storageRoots(info)
	if err != nil {
		return err
	}
	defer done()
	tr := tar.NewReader(r)
	var guard backends.EntryGuard
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := guard.Check(hdr); err != nil {
			return err
		}
		prefix, rest, _ := strings.Cut(hdr.Name, "/")
		root := roots[prefix+"/"]
		if root == nil {
			return boxerr.Validation("snapshot", "bwrap cannot restore archive entry %q (only workspace/, tmp/ and home/)", hdr.Name)
		}
		if err := backends.ExtractEntry(root, rest, hdr, tr); err != nil {
			return boxerr.Failure("bwrap: restoring %s: %v", hdr.Name, err).Wrap(err)
		}
	}
}
