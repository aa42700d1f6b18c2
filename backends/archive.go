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
// its prefix), keeping its mode, owner (when running as root) and mtime.
// Paths that would leave root are refused by root itself.
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
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := root.Chmod(rel, tarMode(hdr)); err != nil {
			return err
		}
	case tar.TypeReg:
		_ = root.Remove(rel)
		f, err := root.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := root.Chmod(rel, tarMode(hdr)); err != nil {
			return err
		}
	case tar.TypeSymlink:
		_ = root.Remove(rel)
		if err := root.Symlink(hdr.Linkname, rel); err != nil {
			return err
		}
	default:
		return nil
	}
	if os.Geteuid() == 0 {
		if err := root.Lchown(rel, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		_ = root.Chtimes(rel, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

// tarMode is a header's mode as os.Chmod takes it (setuid and friends
// included).
func tarMode(hdr *tar.Header) fs.FileMode {
	m := fs.FileMode(hdr.Mode).Perm()
	if hdr.Mode&04000 != 0 {
		m |= fs.ModeSetuid
	}
	if hdr.Mode&02000 != 0 {
		m |= fs.ModeSetgid
	}
	if hdr.Mode&01000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}
