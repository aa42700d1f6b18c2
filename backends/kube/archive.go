package kube

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"path"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.Archiver = (*Backend)(nil)

// errImportDone ends the feeding of an import whose tar has exited.
var errImportDone = errors.New("import ended")

// ExportFiles implements backends.Archiver: the workspace, as `tar -c`
// run in the Pod writes it, renamed under backends.ArchiveWorkspace. Only
// the workspace travels: /tmp and a writable root filesystem's changes are
// the Pod's and are not kept (a suspension loses them too). A host_path
// workspace (a mapped claim) is read only when opts.HostPaths allows it. A
// suspended session gets a Pod on its claim for the time of the export.
func (b *Backend) ExportFiles(ctx context.Context, info backends.Session, opts backends.ExportOptions, w io.Writer) error {
	if b.configErr != nil {
		return b.configErr
	}
	tw := tar.NewWriter(w)
	if info.HostPath != "" && info.HostPathMode != backends.MountNone && !opts.HostPaths {
		return tw.Close()
	}
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
	args := []string{"tar", "-C", mountPath(info), "-cf", "-"}
	for _, rel := range mountsBelow(info) {
		args = append(args, "--exclude=./"+rel)
	}
	run, err := fsRunner{b}.Run(ctx, info, nil, append(args, "."))
	if err != nil {
		return err
	}
	rename := func(n string) string {
		n = strings.TrimPrefix(path.Clean("/"+n), "/")
		if n == "" {
			return ""
		}
		return backends.ArchiveWorkspace + n
	}
	cerr := copyRenamed(tw, tar.NewReader(run.Stdout()), rename, nil)
	if cerr != nil {
		run.Cancel()
	}
	code, stderr, werr := run.Wait()
	if err := firstErr(werr, cerr); err != nil {
		return boxerr.Failure("kube backend: exporting the workspace of session %s: %v", info.SessionID, err).Wrap(err)
	}
	if code != 0 {
		return boxerr.Failure("kube backend: exporting the workspace of session %s: tar exited %d: %s", info.SessionID, code, stderr)
	}
	return tw.Close()
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

// ImportFiles implements backends.Archiver: the workspace/ entries are
// streamed into `tar -x` run in the Pod, below the mount path, as the
// sandbox user (owners are not kept). Entries of any other part (a docker
// or bwrap archive's rootfs/, tmp/, home/) are refused, and every entry
// passes an EntryGuard first (hard links allowed: tar makes them inside
// the Pod, below the mount path).
func (b *Backend) ImportFiles(ctx context.Context, info backends.Session, r io.Reader) error {
	if b.configErr != nil {
		return b.configErr
	}
	pr, pw := io.Pipe()
	run, err := fsRunner{b}.Run(ctx, info, pr, []string{"tar", "-C", mountPath(info), "-xf", "-"})
	if err != nil {
		return err
	}
	feedErr := make(chan error, 1)
	go func() {
		tw := tar.NewWriter(pw)
		var bad error
		guard := backends.EntryGuard{HardLinks: true}
		below := mountsBelow(info)
		check := func(hdr *tar.Header) error {
			if err := guard.Check(hdr); err != nil {
				return err
			}
			rest, _ := strings.CutPrefix(strings.TrimSuffix(hdr.Name, "/"), backends.ArchiveWorkspace)
			for _, rel := range below {
				if rest == rel || strings.HasPrefix(rest, rel+"/") {
					return backends.RefuseEntry(hdr.Name, "it lies in an extra mount, which a restore never writes")
				}
			}
			return nil
		}
		err := copyRenamed(tw, tar.NewReader(r), func(n string) string {
			rest, ok := strings.CutPrefix(n, backends.ArchiveWorkspace)
			if !ok {
				if bad == nil && strings.TrimSuffix(n, "/")+"/" != backends.ArchiveWorkspace {
					bad = boxerr.Validation("snapshot", "the kube backend cannot take archive entry %q (only %s is restored)", n, backends.ArchiveWorkspace)
				}
				return ""
			}
			return strings.TrimPrefix(path.Clean("/"+rest), "/")
		}, check)
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
		return boxerr.Failure("kube backend: restoring the workspace of session %s: %v", info.SessionID, err).Wrap(err)
	}
	if code != 0 {
		return boxerr.Failure("kube backend: restoring the workspace of session %s: tar exited %d: %s", info.SessionID, code, stderr)
	}
	return nil
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
