package bwrap

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
)

// BareCommand is the bwrap command boxrt runs for an exec of argv in a
// session with the default spec and network off — the same options,
// seccomp filter, argument memfd and sandbox user — with the workspace,
// /tmp and /home taken from dir/workspace, dir/tmp and dir/home (made,
// for the sandbox user, when missing) instead of a session's disk, and
// nothing of boxrt around it: no session, stage, cgroup or bookkeeping.
// It is the floor the benchmarks (test/bench) compare the backend with.
// dir's ancestors must be searchable by the sandbox user. release closes
// boxrt's copies of the descriptors; call it once the command has started.
func BareCommand(ctx context.Context, dir string, argv ...string) (cmd *exec.Cmd, release func(), err error) {
	id, err := sandboxIdentity()
	if err != nil {
		return nil, nil, err
	}
	path, err := exec.LookPath("bwrap")
	if err != nil {
		return nil, nil, err
	}
	b := &Backend{bwrap: path, id: id, cg: &cgroupManager{}}
	var files []*os.File
	release = func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, name := range []string{workspaceDir, tmpDir, homeDir} {
		p := filepath.Join(dir, name)
		err := os.Mkdir(p, 0o755)
		if err == nil {
			err = id.chown(unix.AT_FDCWD, p)
		} else if os.IsExist(err) {
			err = nil
		}
		if err != nil {
			release()
			return nil, nil, err
		}
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			release()
			return nil, nil, err
		}
		files = append(files, f)
	}
	l := layout{
		userns:  exists("/proc/self/ns/user") && strings.TrimSpace(readString("/proc/sys/user/max_user_namespaces")) != "0",
		tmp:     files[1],
		home:    files[2],
		binds:   []bind{{dir: files[0], dst: backends.DefaultMountPath}},
		workdir: backends.DefaultMountPath,
	}
	fds := &fdList{next: b.fdBase()}
	args, err := bwrapArgs(l, fds)
	files = append(files, fds.owned...)
	var af *os.File
	if err == nil {
		af, err = argsFile(args)
	}
	if err != nil {
		release()
		return nil, nil, err
	}
	files = append(files, af)
	return b.bwrapCmd(ctx, af, fds, argv), release, nil
}
