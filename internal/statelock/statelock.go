package statelock

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FileName is the lock file in a state directory.
const FileName = "lock"

// Lock is a held state-directory lock. The kernel releases it when the
// process ends, however it ends, so a lock file left behind never blocks a
// later start.
type Lock struct {
	f *os.File
}

// HeldError says that another process holds the directory.
type HeldError struct {
	Dir string
	// PID is the holder's process id as it wrote it, 0 when unknown (it
	// has not written it yet, or wrote something unreadable).
	PID int
}

func (e *HeldError) Error() string {
	holder := "another process (pid unknown)"
	if e.PID > 0 {
		holder = fmt.Sprintf("another boxrt (pid %d)", e.PID)
	}
	return fmt.Sprintf("state directory %s is in use by %s; one runtime per state directory: "+
		"stop that one, or give this one its own with --state-dir DIR (or BOXRT_STATE_DIR)", e.Dir, holder)
}

// Acquire creates dir (0700) if needed and takes its lock without waiting:
// a held lock is a *HeldError naming the holder. The caller keeps the Lock
// for as long as it uses the directory.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Dir: dir, PID: readPID(path)}
		}
		return nil, fmt.Errorf("lock state dir %s: %w", dir, err)
	}
	// Written in place, not through a temporary file and a rename: the
	// lock is on this inode, and a rename would give the next process
	// another one to lock. The pid is only for the message of a process
	// that finds the directory held, so failing to write it (a full disk)
	// does not fail the start; a reader that finds it missing or
	// half-written says "pid unknown".
	if f.Truncate(0) == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

var errNotRegular = errors.New("not a regular file")

// open opens the lock file, creating it. What is in the way of a lock
// file is no state of anyone's (nobody can hold a lock through a symlink
// or a directory), so it is removed instead of failing the start.
func open(path string) (*os.File, error) {
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, fs.ErrPermission) {
			// flock needs no write access; only the pid goes unwritten.
			f, err = os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err == nil {
			if fi, serr := f.Stat(); serr == nil && fi.Mode().IsRegular() {
				return f, nil
			}
			_ = f.Close()
			err = errNotRegular
		}
		if attempt > 0 || !(errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EISDIR) || errors.Is(err, errNotRegular)) {
			return nil, fmt.Errorf("open state dir lock: %w", err)
		}
		if rerr := os.RemoveAll(path); rerr != nil {
			return nil, fmt.Errorf("open state dir lock: %w (removing what is in its way: %v)", err, rerr)
		}
	}
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Release gives the directory up. Only for a process that goes on
// without it: exiting releases it too.
func (l *Lock) Release() error {
	return l.f.Close()
}
