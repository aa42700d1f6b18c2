package backends

import (
	"encoding/base64"
	"errors"
	"io/fs"
	"path"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// The file API (box_fs_*, the files endpoint) names files as the sandbox
// sees them. A backend serves it only below the session's mounts (its
// workspace, extra mounts, skills, /tmp and, on bwrap, /home): the system
// view around them is an image's or the host's, read-only and none of the
// caller's business. Every path is resolved the way the sandbox would
// resolve it (symlinks included); one that resolves outside the mounts is
// refused as a BoxValidationError naming "path", never followed onto the
// host.

// File types on the wire.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// FileInfo is one file as the sandbox sees it. Path is the sandbox path as
// the caller named it (a listing's entries: below the listed path). JSON
// strings cannot hold every byte a file name may: names that are not
// UTF-8 also come base64-encoded (Encoded fills those members).
type FileInfo struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	NameBase64 string    `json:"name_base64,omitempty"`
	PathBase64 string    `json:"path_base64,omitempty"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"`
	MTime      time.Time `json:"mtime"`
}

// Encoded returns fi with name_base64/path_base64 set when its name or
// path is not valid UTF-8.
func (fi FileInfo) Encoded() FileInfo {
	if !utf8.ValidString(fi.Name) {
		fi.NameBase64 = base64.StdEncoding.EncodeToString([]byte(fi.Name))
	}
	if !utf8.ValidString(fi.Path) {
		fi.PathBase64 = base64.StdEncoding.EncodeToString([]byte(fi.Path))
	}
	return fi
}

// FileType maps a file mode to the wire's type name.
func FileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return FileTypeFile
	case m.IsDir():
		return FileTypeDir
	case m&fs.ModeSymlink != 0:
		return FileTypeSymlink
	}
	return FileTypeOther
}

// UnixPerm is a mode's permission bits as chmod numbers them (setuid
// 0o4000, setgid 0o2000, sticky 0o1000 included).
func UnixPerm(m fs.FileMode) uint32 {
	out := uint32(m.Perm())
	for bit, v := range map[fs.FileMode]uint32{fs.ModeSetuid: 0o4000, fs.ModeSetgid: 0o2000, fs.ModeSticky: 0o1000} {
		if m&bit != 0 {
			out |= v
		}
	}
	return out
}

// WriteOptions shape a file write.
type WriteOptions struct {
	// Mode is the new file's permission bits; 0 keeps an existing file's
	// mode and gives a new file 0644.
	Mode fs.FileMode
	// Append appends to the file (created when missing) instead of
	// replacing it through a temporary file and a rename.
	Append bool
}

// DefaultFileMode is the mode of a file written without one.
const DefaultFileMode fs.FileMode = 0o644

// MaxListDepth bounds box_fs_list's depth.
const MaxListDepth = 16

// CheckSandboxPath validates a sandbox path a caller sent and returns it
// cleaned: absolute, no NUL byte. field names the parameter.
func CheckSandboxPath(field, p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", boxerr.Validation(field, "%s must be an absolute path inside the sandbox, got %q", field, p).With("path", p)
	}
	if strings.ContainsRune(p, 0) {
		return "", boxerr.Validation(field, "%s must not contain NUL bytes", field)
	}
	p = path.Clean(p)
	if len(p) >= MaxPathBytes {
		return "", boxerr.Validation(field, "%s is %d bytes long; a path must be shorter than %d bytes", field, len(p), MaxPathBytes).With("path", p)
	}
	for _, name := range strings.Split(p, "/") {
		if len(name) > MaxNameBytes {
			return "", boxerr.Validation(field, "%s %s: name too long (%d bytes; a file name is at most %d bytes)", field, p, len(name), MaxNameBytes).
				With("path", p).With("reason", "name_too_long")
		}
	}
	return p, nil
}

// HostDirs is implemented by a backend whose sandbox directories are
// host directories boxrt can watch (inotify): HostDir returns the host
// path of sandbox directory p, or false when p is not one (another mount
// lies at or under it, or the backend cannot tell). Only a hint of where
// changes happen: what the sandbox sees is still read through the file
// API.
type HostDirs interface {
	HostDir(info Session, p string) (string, bool)
}

// MaxNameBytes and MaxPathBytes are Linux's NAME_MAX and PATH_MAX: every
// backend's kernel refuses longer names, and checking them first makes the
// refusal the same typed error everywhere (the shell-based file API of
// docker and kube could only report a failed command).
const (
	MaxNameBytes = 255
	MaxPathBytes = 4096
)

// FileMount is one directory tree of a sandbox the file API reaches.
type FileMount struct {
	Path     string // inside the sandbox, cleaned
	ReadOnly bool
}

// FileMounts lists what a session's file API reaches besides /tmp (and,
// on bwrap, /home), which the backends add: the workspace at mount_path
// and every active extra mount (skills included) with its mode.
func FileMounts(info Session) []FileMount {
	mp := info.MountPath
	if mp == "" {
		mp = DefaultMountPath
	}
	out := []FileMount{{Path: path.Clean(mp), ReadOnly: info.HostPath != "" && info.HostPathMode == MountRO}}
	for _, m := range info.ExtraMounts {
		if m.Mode != MountNone {
			out = append(out, FileMount{Path: path.Clean(m.MountPath), ReadOnly: m.Mode == MountRO})
		}
	}
	return out
}

// MountFor returns the index of the mount that holds p (the deepest; among
// equal ones the last, which is mounted on top) and p relative to it ("."
// for the mount point itself), or -1.
func MountFor(mounts []FileMount, p string) (int, string) {
	best := -1
	for i, m := range mounts {
		if (p == m.Path || m.Path == "/" || strings.HasPrefix(p, m.Path+"/")) &&
			(best < 0 || len(m.Path) >= len(mounts[best].Path)) {
			best = i
		}
	}
	if best < 0 {
		return -1, ""
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, mounts[best].Path), "/")
	if rel == "" {
		rel = "."
	}
	return best, rel
}

// OutsideMounts is the refusal of a path that is, or resolves to, a place
// outside the session's mounts.
func OutsideMounts(field, requested, resolved string) *boxerr.Error {
	if resolved == requested {
		return boxerr.Validation(field, "%s %s is outside the sandbox's mounts (the file API reaches the workspace, extra mounts, skills and /tmp)", field, requested).
			With("path", requested)
	}
	return boxerr.Validation(field, "%s %s resolves through a symlink to %s, outside the sandbox's mounts", field, requested, resolved).
		With("path", requested)
}

// ReadOnlyPath is the refusal of a write below a read-only mount.
func ReadOnlyPath(field, p string) *boxerr.Error {
	return boxerr.Validation(field, "%s %s is on a read-only mount", field, p).With("path", p).With("reason", "read_only")
}

// maxSymlinks is how many symlinks one resolution follows, as the
// kernel's own limit (ELOOP after 40).
const maxSymlinks = 40

// MountLookup is what ResolveInMounts asks of a backend: lstat and
// readlink of rel below mount i, both without following a last symlink.
type MountLookup struct {
	Lstat    func(i int, rel string) (fs.FileInfo, error)
	Readlink func(i int, rel string) (string, error)
}

// ResolveInMounts resolves the sandbox path p (cleaned) as the sandbox
// would: component by component, each symlink replaced by its target
// (absolute targets restart at the sandbox's root, ".." is applied to
// what was resolved so far), the last one only with follow. Components
// outside every mount (the system view, e.g. /mnt above an extra mount)
// are taken as plain directories: sandboxed code cannot plant links
// there. It returns the mount holding the result and the path below it;
// a result outside the mounts is OutsideMounts. A missing component ends
// the resolution: the rest is taken as written (it is to be created).
func ResolveInMounts(mounts []FileMount, field, p string, follow bool, look MountLookup) (int, string, string, error) {
	todo := strings.Split(strings.TrimPrefix(p, "/"), "/")
	var done []string
	links := 0
	missing := false
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch {
		case name == "" || name == ".":
			continue
		case name == "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		case missing || (len(todo) == 0 && !follow):
			done = append(done, name)
			continue
		}
		cur := "/" + path.Join(append(done, name)...)
		i, rel := MountFor(mounts, cur)
		if i < 0 {
			done = append(done, name)
			continue
		}
		fi, err := look.Lstat(i, rel)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				return 0, "", "", err
			}
			missing = true
			done = append(done, name)
			continue
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			done = append(done, name)
			continue
		}
		if links++; links > maxSymlinks {
			return 0, "", "", boxerr.Validation(field, "%s %s: too many levels of symbolic links", field, p).With("path", p)
		}
		target, err := look.Readlink(i, rel)
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, fs.ErrNotExist) {
			// Swapped since the lstat (no longer a link, or gone), as
			// sandboxed code may do at any time: look at it again. The
			// count above bounds the retries.
			todo = append([]string{name}, todo...)
			continue
		}
		if err != nil {
			return 0, "", "", err
		}
		if strings.HasPrefix(target, "/") {
			done = nil
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	resolved := "/" + path.Join(done...)
	i, rel := MountFor(mounts, resolved)
	if i < 0 {
		return 0, "", resolved, OutsideMounts(field, p, resolved)
	}
	return i, rel, resolved, nil
}

// IsMountPoint reports whether p is, or lies above, one of mounts: such a
// path cannot be removed or renamed (EBUSY in the sandbox too).
func IsMountPoint(mounts []FileMount, p string) bool {
	for _, m := range mounts {
		if m.Path == p || strings.HasPrefix(m.Path, p+"/") || p == "/" {
			return true
		}
	}
	return false
}

// FileError turns the failure of a file operation on p into a typed
// error: missing → BoxFileNotFoundError, a refusal the caller can fix
// (not a directory, not empty, read-only, permission) → BoxValidationError
// naming field, else BoxError. Typed errors pass unchanged.
func FileError(field, p string, err error) error {
	var be *boxerr.Error
	if err == nil || errors.As(err, &be) {
		return err
	}
	var errno syscall.Errno
	errors.As(err, &errno)
	refuse := func(why string) error {
		return boxerr.Validation(field, "%s %s: %s", field, p, why).With("path", p).Wrap(err)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return boxerr.FileNotFound(p).Wrap(err)
	case errno == syscall.EROFS:
		return ReadOnlyPath(field, p).Wrap(err)
	case errors.Is(err, fs.ErrPermission):
		return boxerr.Validation(field, "%s %s: permission denied (as the sandbox's user)", field, p).
			With("path", p).With("reason", "permission_denied").Wrap(err)
	case errno == syscall.ENOTDIR:
		return refuse("a component is not a directory")
	case errno == syscall.EISDIR:
		return refuse("is a directory")
	case errno == syscall.ENOTEMPTY || errno == syscall.EEXIST && strings.Contains(err.Error(), "not empty"):
		return refuse("directory not empty (use recursive)")
	case errors.Is(err, fs.ErrExist):
		return refuse("already exists")
	case errno == syscall.ELOOP || errno == syscall.EXDEV:
		return refuse("a symlink appeared or the path left its mount while it was used")
	case errno == syscall.EBUSY:
		return refuse("is a mount point")
	case errno == syscall.ENOSPC || errno == syscall.EDQUOT:
		return boxerr.Failure("%s %s: no space left on the session's disk (workspace quota)", field, p).With("path", p).Wrap(err)
	case errno == syscall.ENAMETOOLONG:
		return refuse("name too long")
	}
	return boxerr.Failure("%s %s: %v", field, p, err).With("path", p).Wrap(err)
}
