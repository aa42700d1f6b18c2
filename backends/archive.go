package backends

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// WriteTree appends every directory, regular file and symlink below root
// to tw, named prefix + their path relative to root. Symlinks are stored,
// never followed, and files are opened through root, so a tree a sandbox
// rearranges while it is read cannot make it read outside root. Devices,
// fifos and sockets are skipped; hard links become separate files.
func WriteTree(ctx context.Context, tw *tar.Writer, root *os.Root, prefix string) error {
	return fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		fi, err := root.Lstat(p)
		if err != nil {
			return err
		}
		name := prefix + p
		switch {
		case fi.Mode().IsDir():
			return writeHeader(tw, fi, name+"/", "")
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := root.Readlink(p)
			if err != nil {
				return err
			}
			return writeHeader(tw, fi, name, target)
		case fi.Mode().IsRegular():
			f, err := root.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil || !st.Mode().IsRegular() {
				return err // replaced since Lstat: skip it
			}
			if err := writeHeader(tw, st, name, ""); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, f, st.Size()); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		return nil
	})
}

func writeHeader(tw *tar.Writer, fi fs.FileInfo, name, link string) error {
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	return tw.WriteHeader(hdr)
}

// ExtractEntry writes one tar entry below root at rel (already stripped of
// its prefix and checked by an EntryGuard), keeping its mode, owner (when
// running as root) and mtime. Nothing is written through a symlink: a file
// replaces whatever had its name, and a directory's mode, owner and times
// are set through a descriptor opened without following one. Paths that
// would leave root are refused by root itself.
func ExtractEntry(root *os.Root, rel string, hdr *tar.Header, r io.Reader) error {
	rel = strings.TrimPrefix(path.Clean("/"+rel), "/")
	if rel == "" {
		return nil
	}
	if dir := path.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	var f *os.File
	var err error
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		f, err = root.OpenFile(rel, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	case tar.TypeReg:
		_ = root.Remove(rel)
		if f, err = root.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600); err == nil {
			_, err = io.Copy(f, r)
		}
	case tar.TypeSymlink:
		_ = root.Remove(rel)
		if err := root.Symlink(hdr.Linkname, rel); err != nil {
			return err
		}
		if os.Geteuid() == 0 {
			return root.Lchown(rel, hdr.Uid, hdr.Gid)
		}
		return nil
	default:
		return fmt.Errorf("entry type %q is not restored", hdr.Typeflag)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		return err
	}
	err = setMeta(f, hdr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// setMeta sets an extracted file's owner (as root), mode and times through
// its descriptor; the owner goes first, since a chown clears the setuid
// bits a chmod set.
func setMeta(f *os.File, hdr *tar.Header) error {
	if os.Geteuid() == 0 {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := f.Chmod(tarMode(hdr)); err != nil {
		return err
	}
	t := unix.NsecToTimeval(hdr.ModTime.UnixNano())
	_ = unix.Futimes(int(f.Fd()), []unix.Timeval{t, t})
	return nil
}

// tarMode is a header's mode as os.Chmod takes it. Setuid and setgid are
// never set (an EntryGuard also clears them): a restore runs as root and must
// not make a set-id file from an archive.
func tarMode(hdr *tar.Header) fs.FileMode {
	m := fs.FileMode(hdr.Mode).Perm()
	if hdr.Mode&01000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Archivable reports whether an exporter keeps an entry: directories,
// regular files, symlinks and hard links. Devices, FIFOs and sockets carry
// no data a snapshot needs, and an EntryGuard refuses them on restore.
func Archivable(hdr *tar.Header) bool {
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
		return true
	}
	return false
}

// EntryGuard checks the entries of one archive, in stream order, before a
// restore writes them, and neutralises what it keeps: setuid and setgid
// bits are cleared. It refuses (BoxSnapshotCorruptedError) what no boxrt
// export writes, so an archive that has one was altered or is not boxrt's:
// absolute names, "." and ".." components, devices, FIFOs and other
// special files, any entry whose path goes through a symlink the archive
// made earlier (a restore never writes through a symlink), an entry that
// reuses such a symlink's name, and hard links unless HardLinks.
type EntryGuard struct {
	// HardLinks allows a hard link to a regular file the same archive part
	// wrote earlier: the docker engine and tar in a Pod extract it inside
	// the sandbox, below the extraction root. A host-side extraction
	// (bwrap) leaves it false: its exports never hold hard links, and
	// refusing them rules out a link to any file the extraction did not
	// make.
	HardLinks bool

	symlinks map[string]bool
	files    map[string]bool
}

// Check validates hdr (its full archive name, prefix included) and clears
// its setuid and setgid bits.
func (g *EntryGuard) Check(hdr *tar.Header) error {
	name := strings.TrimSuffix(hdr.Name, "/")
	if err := g.checkPath(name); err != nil {
		return RefuseEntry(hdr.Name, err.Error())
	}
	if g.symlinks[name] {
		return RefuseEntry(hdr.Name, "it names a symlink an earlier entry made")
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
	case tar.TypeReg:
		g.remember(&g.files, name)
	case tar.TypeSymlink:
		g.remember(&g.symlinks, name)
	case tar.TypeLink:
		if !g.HardLinks {
			return RefuseEntry(hdr.Name, "hard links are not restored here")
		}
		top, _, _ := strings.Cut(name, "/")
		target := strings.TrimSuffix(hdr.Linkname, "/")
		if !strings.HasPrefix(target, top+"/") || !g.files[target] {
			return RefuseEntry(hdr.Name, fmt.Sprintf("its hard link target %q is not a file written earlier in the same part", hdr.Linkname))
		}
		g.remember(&g.files, name)
	default:
		return RefuseEntry(hdr.Name, fmt.Sprintf("entry type %q (a device, FIFO or other special file) is never restored", hdr.Typeflag))
	}
	hdr.Mode &^= 0o6000
	return nil
}

// checkPath refuses a name that is not a clean relative path, or that goes
// through a symlink the archive made.
func (g *EntryGuard) checkPath(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || strings.ContainsRune(name, 0) {
		return errors.New("it is empty or absolute")
	}
	parts := strings.Split(name, "/")
	for i, p := range parts {
		if p == "" || p == "." || p == ".." {
			return errors.New(`it has an empty, "." or ".." component`)
		}
		if i < len(parts)-1 && g.symlinks[strings.Join(parts[:i+1], "/")] {
			return fmt.Errorf("it goes through the symlink %s an earlier entry made", strings.Join(parts[:i+1], "/"))
		}
	}
	return nil
}

func (g *EntryGuard) remember(m *map[string]bool, name string) {
	if *m == nil {
		*m = map[string]bool{}
	}
	(*m)[name] = true
}

// RefuseEntry is the typed refusal of one archive entry (name) a restore
// will not write, saying why; the runtime adds the snapshot's id.
func RefuseEntry(name, why string) error {
	return boxerr.SnapshotCorrupted("", "archive entry %q is refused: %s; boxrt's own exports never hold such an entry, so the archive was altered or is not boxrt's: take a new snapshot", name, why).
		With("entry", name)
}
