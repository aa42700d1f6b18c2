package backends

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
	"golang.org/x/sys/unix"
)

// blockedHostPaths may never be bound into a sandbox, nor anything under
// them: system directories and container-runtime state.
var blockedHostPaths = []string{
	"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
	"/root", "/run", "/sbin", "/sys", "/usr", "/var/run", "/var/lib/docker",
	"/var/lib/containerd", "/var/lib/containers",
}

// runtimeSockets are refused wherever they live (matched by base name).
var runtimeSockets = []string{"docker.sock", "containerd.sock", "podman.sock", "crio.sock"}

// ResolveHostPath checks a caller-supplied host path against the allow-list:
// symlinks are resolved (for a path that does not exist yet, those of its
// longest existing ancestor), and the result must be one of allowedRoots or
// under it, and must not be "/", a system directory or a runtime socket.
// field names the parameter in the error. It returns the resolved path.
func ResolveHostPath(field, path string, allowedRoots []string) (string, error) {
	if path == "" || !filepath.IsAbs(path) {
		return "", boxerr.Validation(field, "%s %q must be an absolute path", field, path)
	}
	if strings.ContainsRune(path, 0) {
		return "", boxerr.Validation(field, "%s must not contain NUL bytes", field)
	}
	resolved, err := ResolveExisting(filepath.Clean(path))
	if err != nil {
		return "", boxerr.Validation(field, "%s %s cannot be resolved: %v", field, path, err).Wrap(err)
	}
	if resolved == "/" || isBlocked(resolved) {
		return "", boxerr.Validation(field, "%s %s is blocked for security", field, path).With("path", path)
	}
	if len(allowedRoots) == 0 {
		return "", boxerr.Validation(field, "%s %s refused: no local.allowed_mount_roots are configured (set them in boxrt's --config file, or with box_init {\"local\":{\"allowed_mount_roots\":[\"/srv/boxrt\"]}}; see docs/operations.md, Mount roots)", field, path).With("path", path)
	}
	for _, root := range allowedRoots {
		r, err := ResolveExisting(filepath.Clean(root))
		if err != nil {
			continue
		}
		if resolved == r || strings.HasPrefix(resolved, strings.TrimSuffix(r, "/")+"/") {
			return resolved, nil
		}
	}
	return "", boxerr.Validation(field, "%s %s is outside local.allowed_mount_roots %v (add its directory there: boxrt's --config file or box_init)", field, path, allowedRoots).With("path", path)
}

func isBlocked(p string) bool {
	for _, b := range blockedHostPaths {
		if p == b || strings.HasPrefix(p, b+"/") {
			return true
		}
	}
	base := filepath.Base(p)
	for _, s := range runtimeSockets {
		if base == s {
			return true
		}
	}
	return false
}

// ResolveExisting resolves symlinks of p, or of its longest existing ancestor
// when p does not exist yet, and re-appends the missing tail.
func ResolveExisting(p string) (string, error) {
	var tail []string
	cur := p
	for {
		r, err := filepath.EvalSymlinks(cur)
		if err == nil {
			return filepath.Join(append([]string{r}, tail...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return "", err
		}
		tail = append([]string{filepath.Base(cur)}, tail...)
		cur = parent
	}
}

// RecheckHostPath verifies, right before a backend hands path to something
// that follows symlinks (an engine mounting it), that path is still what
// ResolveHostPath returned: it resolves to itself (no component was swapped
// for a symlink since), it is a directory, and it is not blocked. Another
// session with write access to a parent could otherwise plant a symlink to
// /etc between the check and the mount.
func RecheckHostPath(field, path string) error {
	resolved, err := ResolveExisting(path)
	if err != nil {
		return boxerr.Validation(field, "%s %s cannot be resolved any more: %v", field, path, err).With("path", path).Wrap(err)
	}
	if resolved != path || resolved == "/" || isBlocked(resolved) {
		return boxerr.Validation(field, "%s %s changed since it was checked: it now resolves to %s", field, path, resolved).With("path", path)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return boxerr.Validation(field, "%s %s is gone: %v", field, path, err).With("path", path).Wrap(err)
	}
	if !fi.IsDir() {
		return boxerr.Validation(field, "%s %s is no longer a directory", field, path).With("path", path)
	}
	return nil
}

// OpenHostRoot opens a host directory for reading as an os.Root, checking
// it again (no symlink anywhere in its path) at this use: a directory
// swapped for a symlink since the session started is refused, not
// followed. An export reads a host_path workspace this way, never through
// a path an engine resolves again.
func OpenHostRoot(field, path string) (*os.Root, error) {
	fd, _, err := OpenDir(unix.AT_FDCWD, filepath.Clean(path), false, nil)
	if err != nil {
		return nil, hostDirError(field, path, err)
	}
	defer unix.Close(fd)
	r, err := os.OpenRoot(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, boxerr.Failure("cannot open %s %s: %v", field, path, err).Wrap(err)
	}
	return r, nil
}

// hostDirError types a failure to open a host directory without following
// a symlink.
func hostDirError(field, path string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return boxerr.Validation(field, "%s %s is not a plain directory (a symlink or a file is in its path)", field, path).
			With("path", path).Wrap(err)
	}
	if errors.Is(err, unix.ENOENT) {
		return boxerr.Validation(field, "%s %s is gone", field, path).With("path", path).Wrap(err)
	}
	return boxerr.Failure("cannot open %s %s: %v", field, path, err).Wrap(err)
}

// EnsureDir creates a host directory for a rw mount when it is missing.
func EnsureDir(path string) error {
	// Never MkdirAll: as root it would follow a symlink swapped into the
	// path after the allow-list check and create directories wherever it
	// points. Each component is made below its opened parent instead.
	fd, _, err := OpenDir(unix.AT_FDCWD, filepath.Clean(path), true, nil)
	if err != nil {
		return hostDirError("host_path", path, err)
	}
	return unix.Close(fd)
}
