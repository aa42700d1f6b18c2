package statelock

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSecondAcquireNamesTheHolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	l, err := Acquire(dir)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+"\n", string(b))

	// flock is per open file description: a second open in the same
	// process conflicts as another process would.
	_, err = Acquire(dir)
	var held *HeldError
	require.True(t, errors.As(err, &held), "got %v", err)
	require.Equal(t, os.Getpid(), held.PID)
	require.Contains(t, err.Error(), "pid "+strconv.Itoa(os.Getpid()))
	require.Contains(t, err.Error(), "--state-dir")

	require.NoError(t, l.Release())
	l2, err := Acquire(dir)
	require.NoError(t, err, "a released lock is free again")
	require.NoError(t, l2.Release())
}

// A lock file left by a process that died, or anything else in its
// place, is not state: a fresh start goes through.
func TestLeftoversNeverFailAStart(t *testing.T) {
	for name, leave := range map[string]func(path string) error{
		"dead holder's pid": func(p string) error { return os.WriteFile(p, []byte("999999999\n"), 0o600) },
		"garbage":           func(p string) error { return os.WriteFile(p, []byte("\x00not a pid"), 0o600) },
		"read-only file":    func(p string) error { return os.WriteFile(p, []byte("1\n"), 0o400) },
		"dangling symlink":  func(p string) error { return os.Symlink("/nonexistent/boxrt-lock", p) },
		"directory":         func(p string) error { return os.MkdirAll(filepath.Join(p, "x"), 0o700) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, leave(filepath.Join(dir, FileName)))
			l, err := Acquire(dir)
			require.NoError(t, err)
			defer l.Release()
			if name == "read-only file" && os.Geteuid() != 0 {
				return // locked through a read-only descriptor: no pid written
			}
			b, err := os.ReadFile(filepath.Join(dir, FileName))
			require.NoError(t, err)
			require.Equal(t, strconv.Itoa(os.Getpid()), strings.TrimSpace(string(b)))
		})
	}
}

// The lock is the kernel's: it ends with its holder, however that ends.
func TestLockEndsWithTheHolderProcess(t *testing.T) {
	dir := t.TempDir()
	// flock(1) creates the file, takes the lock and then runs the command,
	// which reports that it holds it.
	cmd := exec.Command("flock", "--exclusive", filepath.Join(dir, FileName), "sh", "-c", "echo held; exec sleep 60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	// flock(1) and its command both hold the file: the group goes.
	kill := func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }
	t.Cleanup(kill)
	buf := make([]byte, 5)
	_, err = io.ReadFull(out, buf)
	require.NoError(t, err)
	_, err = Acquire(dir)
	var held *HeldError
	require.True(t, errors.As(err, &held), "flock(1) holding the file must block Acquire, got %v", err)
	require.Zero(t, held.PID, "flock(1) wrote no pid")
	require.Contains(t, err.Error(), "pid unknown")
	kill()
	// The killed command is not waited for (flock(1) is): its exit, and
	// with it the unlock, may take a moment.
	require.Eventually(t, func() bool {
		l, err := Acquire(dir)
		if err != nil {
			return false
		}
		return l.Release() == nil
	}, 10*time.Second, 20*time.Millisecond)
}
