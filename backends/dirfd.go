package backends

import (
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// OpenDir opens rel below the directory dirfd (AT_FDCWD with an
// absolute rel for the host's root) as an O_PATH directory descriptor,
// refusing every symlink on the way and, below a real directory, any
// escape through "..". With create, missing components are made one at a
// time below their already opened parent (0755, then onCreate, when set, runs on each one made);
// created reports whether the last component was made by this call.
func OpenDir(dirfd int, rel string, create bool, onCreate func(parent int, name string) error) (fd int, created bool, err error) {
	resolve := uint64(unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS)
	if dirfd != unix.AT_FDCWD {
		resolve |= unix.RESOLVE_BENEATH
	}
	open := func(dir int, name string) (int, error) {
		for {
			fd, err := unix.Openat2(dir, name, &unix.OpenHow{
				Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
				Resolve: resolve,
			})
			if err != unix.EINTR && err != unix.EAGAIN {
				return fd, err
			}
		}
	}
	fd, err = open(dirfd, rel)
	if err != unix.ENOENT || !create {
		return fd, false, err
	}
	// Walk from the start, creating as we go: each component is opened (or
	// made) below the descriptor of its parent, never through a path.
	start := "."
	if filepath.IsAbs(rel) {
		start = "/"
	}
	cur, err := open(dirfd, start)
	if err != nil {
		return -1, false, err
	}
	for _, name := range strings.Split(strings.Trim(filepath.Clean(rel), "/"), "/") {
		next, err := open(cur, name)
		created = false
		if err == unix.ENOENT {
			err = unix.Mkdirat(cur, name, 0o755)
			if created = err == nil; created && onCreate != nil {
				err = onCreate(cur, name)
			}
			if err == nil || err == unix.EEXIST {
				next, err = open(cur, name)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, false, err
		}
		cur = next
	}
	return cur, created, nil
}
