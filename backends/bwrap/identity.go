package bwrap

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// SandboxUser is the host account sandboxes run as when boxrt is root.
// Sandboxed code must never be host uid 0: with an unprivileged uid, a
// mistake in mount handling (a symlink bwrap follows, a path that changed
// under us) can at worst touch what that account may write, never /etc.
const SandboxUser = "boxrt-sandbox"

// identity is the host uid/gid bwrap runs as. cred is nil when boxrt is
// not root: bwrap then runs as boxrt's own (already unprivileged) user.
type identity struct {
	uid, gid int
	cred     *syscall.Credential
}

// sandboxIdentity finds SandboxUser, creating it (a system account without
// home or shell, like scripts/setup does) when boxrt is root and it is
// missing, so a fresh machine works without a setup step.
func sandboxIdentity() (identity, error) {
	if os.Geteuid() != 0 {
		return identity{uid: os.Getuid(), gid: os.Getgid()}, nil
	}
	u, err := user.Lookup(SandboxUser)
	if errors.As(err, new(user.UnknownUserError)) {
		useradd, lerr := exec.LookPath("useradd")
		if lerr != nil {
			useradd = "/usr/sbin/useradd"
		}
		out, aerr := exec.Command(useradd, "--system", "--user-group", "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", SandboxUser).CombinedOutput()
		// A concurrent boxrt may have won the race: look again either way.
		if u, err = user.Lookup(SandboxUser); err != nil && aerr != nil {
			return identity{}, fmt.Errorf("cannot create the sandbox user %s (%v: %s); create it with: useradd --system --user-group %s",
				SandboxUser, aerr, strings.TrimSpace(string(out)), SandboxUser)
		}
	}
	if err != nil {
		return identity{}, fmt.Errorf("cannot look up the sandbox user %s: %w", SandboxUser, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil || uid == 0 || gid == 0 {
		return identity{}, fmt.Errorf("the sandbox user %s must have a non-zero numeric uid and gid, has %s:%s", SandboxUser, u.Uid, u.Gid)
	}
	return identity{uid: uid, gid: gid, cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}, nil
}

// chown gives a directory boxrt made for the sandbox to the sandbox user.
// It works on O_PATH descriptors and never follows a symlink.
func (id identity) chown(dirfd int, name string) error {
	if id.cred == nil {
		return nil
	}
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	return unix.Fchownat(dirfd, name, id.uid, id.gid, flags)
}
