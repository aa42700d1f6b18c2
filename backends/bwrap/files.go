package bwrap

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// The file API (runtime.FileSystem) works on the host, on the very
// directories the session's sandboxes bind: the workspace (its disk's
// workspace/ or the staged host_path clone), each extra mount and skill
// (staged clones, rw ones idmapped), and the disk's tmp/ and home/ for
// /tmp and /home. A sandbox path is mapped to the mount that holds it and
// resolved component by component as the sandbox would resolve it
// (backends.ResolveInMounts): a symlink is read, never followed by the
// kernel, and its target is mapped through the mount table again, so
// "/workspace/x -> /etc/shadow" or "-> /proc/1/root/…" ends outside the
// mounts and is refused. The final operation goes through an os.Root of
// the mount (openat2 RESOLVE_BENEATH on Linux): a symlink swapped in after
// the resolution cannot leave that mount either.
//
// Every filesystem call runs on a locked OS thread whose fsuid/fsgid are
// the sandbox user's (and no supplementary groups): permissions are
// checked as for sandboxed code, files land owned by whoever the sandbox
// sees as itself (through an rw clone's idmapping: the host directory's
// owner), and root's capabilities never let a write through. The thread
// is discarded afterwards, never returned to Go's pool with changed ids.

// fileView is the mount table of one file call: each mount's sandbox path
// and mode, and an os.Root on its host directory.
type fileView struct {
	mounts []backends.FileMount
	roots  []*os.Root
}

func (v *fileView) close() {
	for _, r := range v.roots {
		r.Close()
	}
}

// view opens the mount table of a session's sandboxes, the way an exec
// lays them out (layoutFor), so the file API sees what commands see.
func (b *Backend) view(info backends.Session) (*fileView, error) {
	dir, err := b.lookup(info)
	if err != nil {
		return nil, err
	}
	sf := b.files(info.BackendSessionID)
	l, err := b.layoutFor(sf, dir, info, "", nil)
	if err != nil {
		return nil, err
	}
	type mount struct {
		dst string
		dir *os.File
		ro  bool
	}
	ms := []mount{{"/tmp", l.tmp, false}, {"/home", l.home, false}}
	for _, bd := range l.binds {
		ms = append(ms, mount{bd.dst, bd.dir, bd.ro})
	}
	// The descriptors belong to the session and StopSession closes them:
	// each Root is opened while sf.mu says they are still open.
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.closed {
		return nil, boxerr.SessionNotFound(info.SessionID).With("reason", "being deleted")
	}
	v := &fileView{}
	for _, m := range ms {
		root, err := os.OpenRoot("/proc/self/fd/" + strconv.Itoa(int(m.dir.Fd())))
		if err != nil {
			v.close()
			return nil, boxerr.Failure("bwrap: open %s of session %s: %v", m.dst, info.SessionID, err).Wrap(err)
		}
		v.mounts = append(v.mounts, backends.FileMount{Path: m.dst, ReadOnly: m.ro})
		v.roots = append(v.roots, root)
	}
	return v, nil
}

// asSandbox runs fn on a locked OS thread acting as the sandbox user for
// file access (boxrt's own identity when it is not root), then gives the
// thread its ids back and returns it to the pool.
//
// The thread must not end with the goroutine: it is any thread of the
// pool, and every bwrap or helper that thread once forked
// holds Pdeathsig tied to it, so its end would SIGKILL those children —
// other sessions' sandboxes and their commands. A thread whose ids cannot
// be restored is parked for good instead, never reused and never ended.
func (b *Backend) asSandbox(fn func() error) error {
	if b.id.cred == nil {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := b.becomeSandboxUser()
		if err == nil {
			err = fn()
		}
		if rerr := restore(); rerr != nil {
			done <- errors.Join(err, rerr)
			select {} // parked: its ids are not boxrt's
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// becomeSandboxUser switches this (locked) thread's supplementary groups
// and file-system ids to the sandbox user's, and returns what switches
// them back. Raw syscalls: Go's wrappers would change every thread.
func (b *Backend) becomeSandboxUser() (restore func() error, err error) {
	groups, err := unix.Getgroups()
	if err != nil {
		return func() error { return nil }, fmt.Errorf("getgroups: %w", err)
	}
	uid, gid := unix.Geteuid(), unix.Getegid()
	restore = func() error {
		if err := setThreadGroups(groups); err != nil {
			return err
		}
		unix.Setfsgid(gid)
		unix.Setfsuid(uid)
		if got, _ := unix.SetfsuidRetUid(-1); got != uid {
			return fmt.Errorf("setfsuid back to %d did not take (fsuid %d)", uid, got)
		}
		return nil
	}
	if err := setThreadGroups(nil); err != nil {
		return restore, err
	}
	unix.Setfsgid(b.id.gid)
	unix.Setfsuid(b.id.uid)
	if got, _ := unix.SetfsuidRetUid(-1); got != b.id.uid {
		return restore, fmt.Errorf("setfsuid %d did not take (fsuid %d)", b.id.uid, got)
	}
	return restore, nil
}

// setThreadGroups sets the calling thread's supplementary groups only.
func setThreadGroups(groups []int) error {
	gids := make([]uint32, len(groups))
	for i, g := range groups {
		gids[i] = uint32(g)
	}
	var p unsafe.Pointer
	if len(gids) > 0 {
		p = unsafe.Pointer(&gids[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gids)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	return nil
}

// withView opens the session's view and runs fn on it as the sandbox
// user, turning failures into typed errors about p.
func (b *Backend) withView(info backends.Session, field, p string, fn func(v *fileView) error) error {
	v, err := b.view(info)
	if err != nil {
		return err
	}
	defer v.close()
	return fileErr(field, p, b.asSandbox(func() error { return fn(v) }))
}

// fileErr is backends.FileError, plus os.Root's refusal of a path that
// escaped its mount (a symlink swapped in during the call).
func fileErr(field, p string, err error) error {
	if err != nil && strings.Contains(err.Error(), "path escapes from parent") {
		return boxerr.Validation(field, "%s %s: a symlink appeared that leaves its mount", field, p).With("path", p).Wrap(err)
	}
	return backends.FileError(field, p, err)
}

// resolve maps p to a mount and a path below it (see
// backends.ResolveInMounts).
func (v *fileView) resolve(field, p string, follow bool) (int, string, error) {
	i, rel, _, err := backends.ResolveInMounts(v.mounts, field, p, follow, backends.MountLookup{
		Lstat:    func(i int, rel string) (fs.FileInfo, error) { return v.roots[i].Lstat(rel) },
		Readlink: func(i int, rel string) (string, error) { return v.roots[i].Readlink(rel) },
	})
	return i, rel, err
}

// writable resolves p for a change: refused on a read-only mount and, with
// whole, when p is a mount point or holds one.
func (v *fileView) writable(field, p string, follow, whole bool) (int, string, error) {
	i, rel, err := v.resolve(field, p, follow)
	if err != nil {
		return 0, "", err
	}
	if v.mounts[i].ReadOnly {
		return 0, "", backends.ReadOnlyPath(field, p)
	}
	resolved := path.Join(v.mounts[i].Path, rel)
	if whole && backends.IsMountPoint(v.mounts, resolved) {
		return 0, "", boxerr.Validation(field, "%s %s is a mount point or holds one", field, p).With("path", p)
	}
	return i, rel, nil
}

func fileInfo(name, p string, fi fs.FileInfo) backends.FileInfo {
	return backends.FileInfo{Name: name, Path: p, Type: backends.FileType(fi.Mode()), Size: fi.Size(),
		Mode: backends.UnixPerm(fi.Mode()), MTime: fi.ModTime().UTC()}
}

// StatFile implements runtime.FileSystem.
func (b *Backend) StatFile(_ context.Context, info backends.Session, p string) (backends.FileInfo, error) {
	var out backends.FileInfo
	err := b.withView(info, "path", p, func(v *fileView) error {
		i, rel, err := v.resolve("path", p, false)
		if err != nil {
			return err
		}
		fi, err := v.roots[i].Lstat(rel)
		if err == nil {
			out = fileInfo(path.Base(p), p, fi)
		}
		return err
	})
	return out, err
}

// ListFiles implements runtime.FileSystem. Symlinks are listed, not
// descended into; nested mounts are listed with their own contents.
func (b *Backend) ListFiles(_ context.Context, info backends.Session, dir string, depth, limit int) ([]backends.FileInfo, error) {
	var out []backends.FileInfo
	err := b.withView(info, "path", dir, func(v *fileView) error {
		var walk func(shown, real string, level int) error
		walk = func(shown, real string, level int) error {
			i, rel, err := v.resolve("path", real, true)
			if err != nil {
				return err
			}
			f, err := v.roots[i].OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY, 0)
			if err != nil {
				return err
			}
			entries, err := f.ReadDir(-1)
			f.Close()
			if err != nil {
				return err
			}
			for _, e := range entries {
				if len(out) >= limit {
					return nil
				}
				fi, err := e.Info()
				if errors.Is(err, fs.ErrNotExist) {
					continue // removed meanwhile
				}
				if err != nil {
					return err
				}
				out = append(out, fileInfo(e.Name(), path.Join(shown, e.Name()), fi))
				if e.IsDir() && level < depth {
					if err := walk(path.Join(shown, e.Name()), path.Join(v.mounts[i].Path, rel, e.Name()), level+1); err != nil {
						return err
					}
				}
			}
			return nil
		}
		return walk(dir, dir, 1)
	})
	return out, err
}

// ReadFile implements runtime.FileSystem.
func (b *Backend) ReadFile(_ context.Context, info backends.Session, p string, offset, length int64) (io.ReadCloser, backends.FileInfo, error) {
	var f *os.File
	var out backends.FileInfo
	err := b.withView(info, "path", p, func(v *fileView) error {
		i, rel, err := v.resolve("path", p, true)
		if err != nil {
			return err
		}
		// O_NONBLOCK: opening a FIFO the sandbox planted must not hang.
		if f, err = v.roots[i].OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			return err
		}
		fi, err := f.Stat()
		if err == nil && !fi.Mode().IsRegular() {
			err = boxerr.Validation("path", "path %s is not a regular file (%s)", p, backends.FileType(fi.Mode())).With("path", p)
		}
		if err == nil {
			out = fileInfo(path.Base(p), p, fi)
			_, err = f.Seek(offset, io.SeekStart)
		}
		if err != nil {
			f.Close()
		}
		return err
	})
	if err != nil {
		return nil, out, err
	}
	if length < 0 {
		return f, out, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, length), f}, out, nil
}

// WriteFile implements runtime.FileSystem: the data goes to a temporary
// file next to the target (created by the sandbox user), renamed over it
// once complete; append opens the target itself.
func (b *Backend) WriteFile(_ context.Context, info backends.Session, p string, r io.Reader, opts backends.WriteOptions) (int64, error) {
	v, err := b.view(info)
	if err != nil {
		return 0, err
	}
	defer v.close()
	var f *os.File
	var root *os.Root
	var rel, tmp string
	err = b.asSandbox(func() error {
		i, r, err := v.writable("path", p, true, false)
		if err != nil {
			return err
		}
		root, rel = v.roots[i], r
		if rel == "." {
			return boxerr.Validation("path", "path %s is a mount point (a directory)", p).With("path", p)
		}
		if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
			return err
		}
		mode := opts.Mode
		old, err := root.Lstat(rel)
		switch {
		case err == nil && old.IsDir():
			return syscall.EISDIR
		case err == nil && mode == 0:
			mode = old.Mode().Perm()
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if mode == 0 {
			mode = backends.DefaultFileMode
		}
		if opts.Append {
			f, err = root.OpenFile(rel, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
			if err == nil && old == nil {
				err = f.Chmod(mode)
			}
		} else {
			tmp = path.Join(path.Dir(rel), ".boxrt-upload-"+randomSuffix())
			f, err = root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err == nil {
				err = f.Chmod(mode)
			}
		}
		if err == nil {
			var fi fs.FileInfo
			if fi, err = f.Stat(); err == nil && !fi.Mode().IsRegular() {
				err = boxerr.Validation("path", "path %s is not a regular file (%s)", p, backends.FileType(fi.Mode())).With("path", p)
			}
		}
		if err != nil && f != nil {
			f.Close()
			if tmp != "" {
				_ = root.Remove(tmp)
			}
		}
		return err
	})
	if err != nil {
		return 0, fileErr("path", p, err)
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if tmp == "" {
		return n, fileErr("path", p, err)
	}
	err = b.asSandbox(func() error {
		if err == nil {
			err = root.Rename(tmp, rel)
		}
		if err != nil {
			_ = root.Remove(tmp)
		}
		return err
	})
	return n, fileErr("path", p, err)
}

func randomSuffix() string {
	var buf [8]byte
	_, _ = rand.Read(buf[:])
	return hex.EncodeToString(buf[:])
}

// RemoveFile implements runtime.FileSystem.
func (b *Backend) RemoveFile(_ context.Context, info backends.Session, p string, recursive bool) error {
	return b.withView(info, "path", p, func(v *fileView) error {
		i, rel, err := v.writable("path", p, false, true)
		if err != nil {
			return err
		}
		if _, err := v.roots[i].Lstat(rel); err != nil {
			return err
		}
		if recursive {
			return v.roots[i].RemoveAll(rel)
		}
		return v.roots[i].Remove(rel)
	})
}

// MakeDir implements runtime.FileSystem.
func (b *Backend) MakeDir(_ context.Context, info backends.Session, p string) error {
	return b.withView(info, "path", p, func(v *fileView) error {
		i, rel, err := v.resolve("path", p, true)
		if err != nil {
			return err
		}
		if fi, err := v.roots[i].Stat(rel); err == nil {
			if !fi.IsDir() {
				return syscall.EEXIST
			}
			return nil
		}
		if v.mounts[i].ReadOnly {
			return backends.ReadOnlyPath("path", p)
		}
		return v.roots[i].MkdirAll(rel, 0o755)
	})
}

// RenameFile implements runtime.FileSystem. Both paths must lie in the
// same mount (EXDEV in the sandbox too).
func (b *Backend) RenameFile(_ context.Context, info backends.Session, from, to string) error {
	return b.withView(info, "from", from, func(v *fileView) error {
		i, relFrom, err := v.writable("from", from, false, true)
		if err != nil {
			return err
		}
		j, relTo, err := v.writable("to", to, false, true)
		if err != nil {
			return err
		}
		if i != j {
			return boxerr.Validation("to", "to %s is on another mount than from %s (rename cannot move between mounts)", to, from).With("path", to)
		}
		if _, err := v.roots[i].Lstat(relFrom); err != nil {
			return err
		}
		if err := v.roots[i].Rename(relFrom, relTo); err != nil {
			return fileErr("to", to, err)
		}
		return nil
	})
}

// HostDir implements backends.HostDirs for the workspace: its host
// directory (host_path, or the session's own) is where the sandbox's
// changes land, unless a mount (an extra mount, a skill) sits at or under
// p, whose changes a watch of the workspace would miss.
func (b *Backend) HostDir(info backends.Session, p string) (string, bool) {
	mp := path.Clean(info.MountPathOrDefault())
	rel, ok := strings.CutPrefix(path.Clean(p), mp)
	if !ok || rel != "" && rel[0] != '/' {
		return "", false
	}
	for _, m := range backends.FileMounts(info)[1:] {
		if m.Path == p || strings.HasPrefix(m.Path, p+"/") {
			return "", false
		}
	}
	root := info.HostPath
	switch {
	case root != "" && info.HostPathMode == backends.MountNone:
		return "", false
	case root != "":
	case b.diskQuota:
		root = path.Join(stageRoot, b.cfg.InstanceID, info.BackendSessionID, fsDir, workspaceDir)
	default:
		dir, ok := b.sessionDir(info)
		if !ok {
			return "", false
		}
		root = path.Join(dir, fsDir, workspaceDir)
	}
	return path.Join(root, rel), true
}
