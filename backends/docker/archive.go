package docker

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/docker/docker/api/types/container"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.Archiver = (*Backend)(nil)

// engineManaged are paths of the container's root the engine provides
// (kernel filesystems, files it binds in), and boxrt's pidDir: never part
// of a snapshot.
var engineManaged = []string{"/dev", "/proc", "/sys", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/.dockerenv", "/sbin/docker-init", pidDir}

// ExportFiles implements backends.Archiver, for a running or stopped
// container: the workspace and /tmp (the session's own mounts), then every
// path the container's writable layer added or changed (ContainerDiff:
// installed packages and the like), outside every mount the engine reports
// for the container. The engine reads only what is the container's own
// (its volumes, boxrt's disks, its layer): it resolves a bind's source
// path again when archiving, so a host_path workspace (only when
// opts.HostPaths) is read by boxrt itself, through a descriptor opened
// without following a symlink, and extra mounts are never read. Files
// deleted from the image are not recorded.
func (b *Backend) ExportFiles(ctx context.Context, info backends.Session, opts backends.ExportOptions, w io.Writer) error {
	name := info.BackendSessionID
	c, err := b.inspectOwned(ctx, info)
	if err != nil {
		return err
	}
	mountPath := path.Clean(info.MountPathOrDefault())
	tw := tar.NewWriter(w)
	switch {
	case info.HostWorkspace() && opts.HostPaths:
		root, err := backends.OpenHostRoot("host_path", info.HostPath)
		if err != nil {
			return err
		}
		err = backends.WriteTree(ctx, tw, root, backends.ArchiveWorkspace)
		root.Close()
		if err != nil {
			return boxerr.Failure("docker backend: archiving host_path %s: %v", info.HostPath, err).Wrap(err)
		}
	case !info.HostWorkspace():
		if err := b.copyMount(ctx, tw, name, c, mountPath, backends.ArchiveWorkspace); err != nil {
			return err
		}
	}
	// /tmp is the session's own mount (see tmpMount), unless an earlier
	// boxrt made the container (a tmpfs, or the layer's /tmp).
	if hasMount(c, "/tmp") {
		if err := b.copyMount(ctx, tw, name, c, "/tmp", backends.ArchiveTmp); err != nil {
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
	for _, p := range layerPaths(changes, notLayer(c, mountPath)) {
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

// copyMount appends container name's own mount dir (its workspace, its
// /tmp) to tw under prefix, leaving out what lies in other mounts nested
// in it.
func (b *Backend) copyMount(ctx context.Context, tw *tar.Writer, name string, c container.InspectResponse, dir, prefix string) error {
	base, nested := path.Base(dir), notLayer(c, dir)[1:]
	return b.copyOut(ctx, tw, name, dir, func(n string) string {
		rest, ok := strings.CutPrefix(n, base)
		if !ok || (rest != "" && rest[0] != '/') || underAny(path.Join(dir, rest), nested) {
			return ""
		}
		return prefix + strings.TrimPrefix(rest, "/")
	})
}

// notLayer are the container's paths whose content is not its layer's:
// own first (a mount of the session's own being read or written), then
// what the engine (or boxrt, pidDir) provides and every other mount it
// reports (the workspace, extra mounts and skills included, whatever the
// session record says).
func notLayer(c container.InspectResponse, own string) []string {
	out := append([]string{own}, engineManaged...)
	for _, m := range c.Mounts {
		if d := path.Clean(m.Destination); d != own {
			out = append(out, d)
		}
	}
	return out
}

// hasMount reports whether the engine reports a mount of c at dir.
func hasMount(c container.InspectResponse, dir string) bool {
	for _, m := range c.Mounts {
		if path.Clean(m.Destination) == dir {
			return true
		}
	}
	return false
}

// underAny reports whether p is at or below one of dirs.
func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || d == "/" || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
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
		if n == "" || !backends.Archivable(hdr) || strings.HasSuffix(n, "/") && hdr.Typeflag != tar.TypeDir {
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
// read-only root filesystem), tmp/ entries into /tmp (rootfs/tmp/ ones too:
// snapshots of writable root filesystems made before /tmp was a mount),
// each through the engine, owners kept. Every entry passes an EntryGuard
// first (hard links allowed: the engine makes them below the extraction
// root, inside the container); nothing is extracted into a mount: a
// host_path workspace takes no workspace/ entry and no rootfs/ entry may
// land at or below a mount of the container.
func (b *Backend) ImportFiles(ctx context.Context, info backends.Session, r io.Reader) error {
	name := info.BackendSessionID
	c, err := b.inspectOwned(ctx, info)
	if err != nil {
		return err
	}
	mountPath := path.Clean(info.MountPathOrDefault())
	mounts := notLayer(c, mountPath)
	guard := backends.EntryGuard{HardLinks: true}
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
		if err == nil {
			layerTmpToMount(hdr)
			err = checkImportEntry(&guard, hdr, info.HostWorkspace(), mounts)
		}
		if err != nil {
			if sec != nil {
				sec.abort(err)
			}
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
			case prefix == backends.ArchiveTmp && hasMount(c, "/tmp"):
				dest = "/tmp"
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

// layerTmpToMount renames an entry of the layer's /tmp (rootfs/tmp/…) to
// the tmp/ part, as /tmp is a mount now.
func layerTmpToMount(hdr *tar.Header) {
	const layerTmp = backends.ArchiveRootfs + "tmp/"
	if rest, ok := strings.CutPrefix(hdr.Name, layerTmp); ok {
		hdr.Name = backends.ArchiveTmp + rest
		if hdr.Typeflag == tar.TypeLink {
			if target, ok := strings.CutPrefix(hdr.Linkname, layerTmp); ok {
				hdr.Linkname = backends.ArchiveTmp + target
			}
		}
	}
}

// checkImportEntry applies the guard and keeps entries out of mounts
// (notLayer's list, the workspace first): no workspace/ entry for a
// host_path workspace (a boxrt export of one that is restored into a
// host_path has none), no entry at or below another mount (a boxrt export
// leaves those out).
func checkImportEntry(guard *backends.EntryGuard, hdr *tar.Header, hostWS bool, mounts []string) error {
	if err := guard.Check(hdr); err != nil {
		return err
	}
	name := strings.TrimSuffix(hdr.Name, "/")
	inMount := false
	if rest, ok := strings.CutPrefix(name+"/", backends.ArchiveWorkspace); ok {
		if hostWS {
			return backends.RefuseEntry(hdr.Name, "the session's workspace is a host directory, which a restore never writes")
		}
		inMount = underAny(path.Join(mounts[0], rest), mounts[1:])
	} else if rest, ok := strings.CutPrefix(name+"/", backends.ArchiveTmp); ok {
		inMount = underAny(path.Join("/tmp", rest), slices.DeleteFunc(slices.Clone(mounts), func(m string) bool { return m == "/tmp" }))
	} else if rest, ok := strings.CutPrefix(name, backends.ArchiveRootfs); ok {
		inMount = underAny("/"+rest, mounts)
	}
	if inMount {
		return backends.RefuseEntry(hdr.Name, "it lies in a mount of the container, which a restore never writes")
	}
	return nil
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

// abort breaks the section's stream, so the engine does not take it as a
// whole archive.
func (s *section) abort(err error) {
	s.pw.CloseWithError(err)
	<-s.errc
}

func (s *section) close() error {
	err := s.tw.Close()
	s.pw.CloseWithError(err)
	return errors.Join(err, <-s.errc)
}
