package loopdisk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoMkfs is the cause of an error when mkfs.ext4 is not installed.
var ErrNoMkfs = errors.New("mkfs.ext4 is missing (apt-get install e2fsprogs)")

// Tools finds mkfs.ext4 when disks can be made here (root, loop devices);
// otherwise why says why not, for the backends' Describe notes.
func Tools() (mkfs string, why string) {
	if os.Geteuid() != 0 {
		return "", "boxrt is not root"
	}
	mkfs, err := LookSbin("mkfs.ext4")
	if err != nil {
		return "", ErrNoMkfs.Error()
	}
	if _, err := os.Stat(loopControl); err != nil {
		return "", ErrNoLoopDevices.Error()
	}
	return mkfs, ""
}

// Mkfs finds mkfs.ext4; its error is ErrNoMkfs.
func Mkfs() (string, error) {
	p, err := LookSbin("mkfs.ext4")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoMkfs, err)
	}
	return p, nil
}

// LookSbin finds a system tool also when PATH lacks the sbin directories
// (services often run with a minimal PATH).
func LookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
}

// Format makes a new sparse image of mb MiB at img holding an ext4 whose
// root is root's (mode 0755), with a copy of skel's contents (owners and
// modes included) when skel is not "": the image is complete without ever
// being mounted here.
func Format(ctx context.Context, mkfs, img string, mb int, skel string) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(mb) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// No blocks reserved for root. Lazy inode-table and journal init keep
	// the image sparse; the small journal (4 MiB instead of up to 1 GiB)
	// keeps the fs overhead of a small quota small.
	args := []string{"-q", "-F", "-m", "0", "-J", "size=4",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0"}
	if skel != "" {
		args = append(args, "-d", skel)
	}
	if out, err := exec.CommandContext(ctx, mkfs, append(args, img)...).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %v: %s", img, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// CopySparse copies the image src to a new file dst, leaving src's holes
// holes (a fresh ext4 image is almost all hole).
func CopySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = copyData(int(in.Fd()), int(out.Fd()), fi.Size())
	if err == nil {
		err = out.Truncate(fi.Size())
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(dst)
	}
	return err
}

// copyData copies the data extents of in to the same offsets of out.
func copyData(in, out int, size int64) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for r, w := data, data; r < hole; {
			n, err := unix.CopyFileRange(in, &r, out, &w, int(hole-r), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("copy: unexpected end of file at %d", r)
			}
		}
		off = hole
	}
	return nil
}
