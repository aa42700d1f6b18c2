package skills

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Work directories (the private temp directory, install staging) are kept
// flock-ed for as long as they are in use. The kernel drops the lock when
// its holder dies, so at start the store can tell what a killed boxrt left
// behind from what another live boxrt sharing the directory is using.

// privatePrefix names the private work directories in the temp parent.
const privatePrefix = "boxrt-skills-"

// lockDir opens dir and takes an exclusive flock on it without waiting.
// Closing the returned file releases it.
func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// removeLeftovers deletes parent's directories named prefix* that belong
// to this user and that nobody holds locked. Anything else (a live lock, an
// unreadable entry, a symlink, another user's directory) is left alone.
func removeLeftovers(parent, prefix string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		f, err := lockDir(dir)
		if err != nil {
			continue
		}
		_ = os.RemoveAll(dir)
		f.Close()
	}
}
