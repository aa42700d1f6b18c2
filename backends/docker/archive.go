package docker

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/docker/docker/api/types/container"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

var _ backends.Archiver = (*Backend)(nil)

// engineManaged are paths of the container's root the engine provides
// (kernel filesystems, files it binds in): never part of a snapshot.
var engineManaged = []string{"/dev", "/proc", "/sys", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/.dockerenv", "/sbin/docker-init"}

// ExportFiles implements backends.Archiver, for a running or stopped
// container: the workspace (volume, quota disk, or host_path when
// opts.HostPaths) read through the engine, then every path the container's
// writable layer added or changed (ContainerDiff: installed packages and
// the like), outside the session's mounts. Files deleted from the image
// are not recorded.
func (b *Backend) ExportFiles(ctx context.Context, info backends.Session, opts backends.ExportOptions, w io.Writer) error {
	name := info.BackendSessionID
	if err := b.owned(ctx, info); err != nil {
		return err
	}
	mountPath := info.MountPathOrDefault()
	tw := tar.NewWriter(w)
	hostWS := info.HostPath != "" && info.HostPathMode != backends.MountNone
	if !hostWS || opts.HostPaths {
		base := path.Base(mountPath)
		err := b.copyOut(ctx, tw, name, mountPath, func(n string) string {
			rest, ok := strings.CutPrefix(n, base)
			if !ok || (rest != "" && rest[0] != '/') {
				return ""
			}
			return backends.ArchiveWorkspace + strings.TrimPrefix(rest, "/")
		})
		if err != nil {
			return err
		}
	}
	if info.ReadOnlyRootfs {
		// Nothing can have changed in a read-only layer.
		return tw.Close()
	}
	changes, err := b.cli.ContainerDiff(ctx, name)
	if err != nil {
		return b.sessionError(info, "listing the changes of container "+name, err)
	}
	mounts := []string{mountPath}
	for _, m := range info.ExtraMounts {
		mounts = append(mounts, m.MountPath)
	}
	for _, p := range layerPaths(changes, append(mounts, engineManaged...)) {
		dir := path.Dir(p)
		err := b.copyOut(ctx, tw, name, p, func(n string) string {
			return backends.ArchiveRootfs + strings.TrimPrefix(path.Join(dir, n), "/")
		})
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

// layerPaths picks the fewest paths that cover a container's changes: an
// added path covers everything below it, a changed directory is left to its
// listed children. Paths at, below or above a mount (mounts) are skipped:
// their content is not the layer's.
func layerPaths(changes []container.FilesystemChange, mounts []string) []string {
	kinds := map[string]container.ChangeType{}
	var all []string
	for _, c := range changes {
		kinds[c.Path] = c.Kind
		all = append(all, c.Path)
	}
	sort.Strings(all)
	hasChild := func(p string) bool {
		i := sort.SearchStrings(all, p+"/")
		return i < len(all) && strings.HasPrefix(all[i], p+"/")
	}
	near := func(p string) bool {
		for _, m := range mounts {
			if p == m || strings.HasPrefix(p, m+"/") || strings.HasPrefix(m, p+"/") {
				return true
			}
		}
		return false
	}
	var out []string
	for _, p := range all {
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]+"/") {
			continue // covered by an added ancestor
		}
		switch kinds[p] {
		case container.ChangeAdd:
		case container.ChangeModify:
			if hasChild(p) {
				continue
			}
		default:
			continue
		}
		if !near(p) {
			out = append(out, p)
		}
	}
	return out
}

// copyOut appends the engine's archive of src to tw with each entry renamed
// (an empty name drops the entry).
func (b *Backend) copyOut(ctx context.Context, tw *tar.Writer, name, src string, rename func(string) string) error {
	rc, _, err := b.cli.CopyFromContainer(ctx, name, src)
	if err != nil {
		return b.apiError("reading "+src+" of container "+name, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return boxerr.Failure("docker backend: reading %s of container %s: %v", src, name, err).Wrap(err)
		}
		n := rename(strings.TrimSuffix(hdr.Name, "/"))
		if n == "" || strings.HasSuffix(n, "/") && hdr.Typeflag != tar.TypeDir {
			continue
		}
		if hdr.Typeflag == tar.TypeLink {
			if hdr.Linkname = rename(strings.TrimSuffix(hdr.Linkname, "/")); hdr.Linkname == "" {
				continue
			}
		}
		if hdr.Typeflag == tar.TypeDir && !strings.HasSuffix(n, "/") {
			n += "/"
		}
		hdr.Name = n
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// ImportFiles implements backends.Archiver: workspace/ entries are copied
// into the mount path, rootfs/ entries onto the root (refused for a
// read-only root filesystem), each through the engine, owners kept.
func (b *Backend) ImportFiles(ctx context.Context, info backends.Session, r io.Reader) error {
	name := info.BackendSessionID
	mountPath := info.MountPathOrDefault()
	tr := tar.NewReader(r)
	var sec *section
	finish := func() error {
		if sec == nil {
			return nil
		}
		err := sec.close()
		sec = nil
		return err
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return finish()
		}
		if err != nil {
			_ = finish()
			return err
		}
		prefix, rest, _ := strings.Cut(hdr.Name, "/")
		prefix += "/"
		if sec == nil || sec.prefix != prefix {
			if err := finish(); err != nil {
				return err
			}
			var dest string
			switch {
			case prefix == backends.ArchiveWorkspace:
				dest = mountPath
			case prefix == backends.ArchiveRootfs && !info.ReadOnlyRootfs:
				dest = "/"
			default:
				return boxerr.Validation("snapshot", "the session cannot take archive entry %q (read_only_rootfs, or not a docker archive)", hdr.Name)
			}
			sec = b.openSection(ctx, name, dest, prefix)
		}
		if rest == "" {
			continue
		}
		hdr.Name = rest
		if hdr.Typeflag == tar.TypeLink {
			hdr.Linkname = strings.TrimPrefix(hdr.Linkname, prefix)
		}
		if err := sec.tw.WriteHeader(hdr); err != nil {
			return errors.Join(err, finish())
		}
		if _, err := io.Copy(sec.tw, tr); err != nil {
			return errors.Join(err, finish())
		}
	}
}

// section streams one part of an archive into the container.
type section struct {
	prefix string
	tw     *tar.Writer
	pw     *io.PipeWriter
	errc   chan error
}

func (b *Backend) openSection(ctx context.Context, name, dest, prefix string) *section {
	pr, pw := io.Pipe()
	s := &section{prefix: prefix, tw: tar.NewWriter(pw), pw: pw, errc: make(chan error, 1)}
	go func() {
		err := b.cli.CopyToContainer(ctx, name, dest, pr, container.CopyToContainerOptions{})
		if err != nil {
			err = b.apiError("restoring "+dest+" of container "+name, err)
		}
		pr.CloseWithError(err)
		s.errc <- err
	}()
	return s
}

func (s *section) close() error {
	err := s.tw.Close()
	s.pw.CloseWithError(err)
	return errors.Join(err, <-s.errc)
}
