package bwrap

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// rw host directories (host_path, extra mounts, skills) usually belong to
// root, which the sandbox user is not. Their stage clone is therefore an
// idmapped mount whose mapping swaps host uid/gid 0 and the sandbox
// user's: through it the sandbox sees root's files as its own and what it
// writes lands as root's on disk — as with Docker or a root sandbox —
// while everything else it can reach (its disk, /tmp, /home, and any path
// a mount mistake might lead to) stays the unprivileged user's. Staged
// clones are also nosuid and nodev.

// idmapUserns returns the user namespace carrying that mapping, made once
// per Backend (nil when boxrt is not root: nothing is staged then).
func (b *Backend) idmapUserns() (*os.File, error) {
	if b.id.cred == nil {
		return nil, nil
	}
	b.idmapOnce.Do(func() { b.idmap, b.idmapErr = newIdmapUserns(b.sh, b.id) })
	return b.idmap, b.idmapErr
}

// newIdmapUserns starts a child in a new user namespace with the swapped
// mapping, keeps a descriptor of the namespace and lets the child go.
func newIdmapUserns(sh string, id identity) (*os.File, error) {
	cmd := exec.Command(sh, "-c", "read _")
	cmd.Env = []string{}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: swapMapping(id.uid),
		GidMappings: swapMapping(id.gid),
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("user namespace for idmapped mounts: %w", err)
	}
	ns, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	stdin.Close()
	_ = cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("user namespace for idmapped mounts: %w", err)
	}
	return ns, nil
}

// swapMapping maps every id to itself except 0 and id, which trade places.
func swapMapping(id int) []syscall.SysProcIDMap {
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: id, Size: 1}, {ContainerID: id, HostID: 0, Size: 1}}
	if id > 1 {
		m = append(m, syscall.SysProcIDMap{ContainerID: 1, HostID: 1, Size: id - 1})
	}
	// Up to 4294967294: (uid_t)-1 is no id.
	return append(m, syscall.SysProcIDMap{ContainerID: id + 1, HostID: id + 1, Size: 4294967294 - id})
}
