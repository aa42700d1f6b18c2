package runtime

import (
	"errors"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
)

// dirNotify tells a watch whether anything changed under a watched tree
// whose directories are host directories (backends.HostDirs): inotify on
// each directory of the last listing, so an idle watch lists nothing.
// Watches are added without following a symlink; a directory the sandbox
// swapped for a symlink or any event lost (queue overflow) only costs a
// listing, and a full listing every notifyRelist catches what inotify
// cannot see.
type dirNotify struct {
	fd       int
	host     string // host directory of the watched sandbox path
	sandbox  string // the watched sandbox path
	listedAt time.Time
	buf      []byte // for draining events
}

// notifyRelist is how often a notified watch lists anyway.
const notifyRelist = 10 * time.Second

const notifyMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW

// newDirNotify returns a notifier for sandbox directory dir, or nil where
// the backend's directories are not the host's or inotify is unavailable
// (the watch then polls).
func newDirNotify(fsys FileSystem, info backends.Session, dir string) *dirNotify {
	hd, ok := fsys.(backends.HostDirs)
	if !ok {
		return nil
	}
	host, ok := hd.HostDir(info, dir)
	if !ok {
		return nil
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	return &dirNotify{fd: fd, host: host, sandbox: dir}
}

// listed adds the directories of a fresh listing (and the root) to the
// watched set; the kernel drops those that are removed.
func (n *dirNotify) listed(snap map[string]backends.FileInfo, now time.Time) {
	n.listedAt = now
	_, _ = unix.InotifyAddWatch(n.fd, n.host, notifyMask)
	for p, fi := range snap {
		if fi.Type != backends.FileTypeDir {
			continue
		}
		if rel, ok := strings.CutPrefix(p, n.sandbox+"/"); ok || n.sandbox == "/" {
			_, _ = unix.InotifyAddWatch(n.fd, path.Join(n.host, rel), notifyMask)
		}
	}
}

// quiet tells, draining the queue, whether nothing happened since the
// last listing and it is recent enough to stand.
func (n *dirNotify) quiet(now time.Time) bool {
	changed := false
	if n.buf == nil {
		n.buf = make([]byte, 16<<10)
	}
	for {
		k, err := unix.Read(n.fd, n.buf)
		if k > 0 {
			changed = true
			continue
		}
		if !errors.Is(err, unix.EAGAIN) {
			changed = true
		}
		break
	}
	return !changed && now.Sub(n.listedAt) < notifyRelist
}

func (n *dirNotify) close() { _ = unix.Close(n.fd) }
