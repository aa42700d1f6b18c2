package docker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Every container gets an explicit seccomp profile instead of the
// engine's built-in one: an engine before 25.0 has a default that lets
// socket(AF_VSOCK) through, and none keeps setuid bits off files. The
// profile is Docker's current default (which denies AF_VSOCK) with the
// rules bwrap's filter adds: no syscall that sets a mode may set S_ISUID
// or S_ISGID (a host directory bound writable would get a setuid file of
// the container's user, root with docker.user "0:0"), and openat2, whose
// mode sits in memory a filter cannot read, is ENOSYS so libc and Go fall
// back to openat. An engine that does not know a syscall of the profile
// skips it. gVisor (runsc with --oci-seccomp) applies it inside the
// sandbox, to the container's first process and what it starts.
var seccompProfile = sync.OnceValues(func() ([]byte, error) { return buildSeccompProfile(false) })

// gvisorSeccompProfile is seccompProfile for gVisor sessions. runsc
// 20221219 ignores a rule's errno and answers EPERM (measured): clone3's
// ENOSYS, on which glibc falls back to clone, would become EPERM, and no
// program could start a thread. clone3 is allowed there instead: the
// sentry answers it ENOSYS itself (measured, unconfined), and what it
// could otherwise do unchecked, namespaces, would be the sentry's own, as
// unshare already is. openat2 stays denied (EPERM: glibc and Go do not
// use it).
var gvisorSeccompProfile = sync.OnceValues(func() ([]byte, error) { return buildSeccompProfile(true) })

func buildSeccompProfile(gvisor bool) ([]byte, error) {
	p := seccomp.DefaultProfile()
	guarded := func(name string) bool {
		_, ok := backends.ModeArgument[name]
		return ok || name == "openat2"
	}
	for _, s := range p.Syscalls {
		if s.Action == specs.ActAllow && len(s.Args) == 0 {
			s.Names = slices.DeleteFunc(s.Names, guarded)
		}
		if gvisor && s.Action == specs.ActErrno && slices.Equal(s.Names, []string{"clone3"}) {
			s.Action, s.ErrnoRet = specs.ActAllow, nil
		}
	}
	for name, arg := range backends.ModeArgument {
		p.Syscalls = append(p.Syscalls, &seccomp.Syscall{LinuxSyscall: specs.LinuxSyscall{
			Names:  []string{name},
			Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{
				{Index: arg, Value: unix.S_ISUID | unix.S_ISGID, ValueTwo: 0, Op: specs.OpMaskedEqual},
			},
		}})
	}
	enosys := uint(unix.ENOSYS)
	p.Syscalls = append(p.Syscalls, &seccomp.Syscall{LinuxSyscall: specs.LinuxSyscall{
		Names: []string{"openat2"}, Action: specs.ActErrno, ErrnoRet: &enosys,
	}})
	b, err := json.Marshal(p)
	if err != nil {
		return nil, boxerr.Failure("docker: cannot build the seccomp profile: %v", err).Wrap(err)
	}
	return b, nil
}

// securityOpts are the SecurityOpt of a container of sb: no new
// privileges and the seccomp profile, worked out once per backend. Docker
// takes the profile inline; Podman's Docker API reads seccomp=<value> as a
// file name, so on a Podman engine of this host the profile is written to
// a file it can read, and a remote Podman keeps its own default profile
// (there is no way to hand it one). gVisor sessions get their variant
// (never on Podman, which cannot run them: checkRuntimes).
func (b *Backend) securityOpts(ctx context.Context, sb backends.Sandbox) ([]string, error) {
	if b.OnGVisor(sb) {
		profile, err := gvisorSeccompProfile()
		if err != nil {
			return nil, err
		}
		return []string{"no-new-privileges", "seccomp=" + string(profile)}, nil
	}
	b.secOptsMu.Lock()
	defer b.secOptsMu.Unlock()
	if b.secOpts != nil {
		return b.secOpts, nil
	}
	profile, err := seccompProfile()
	if err != nil {
		return nil, err
	}
	podman, err := b.isPodman(ctx)
	if err != nil {
		return nil, err
	}
	opts := []string{"no-new-privileges"}
	switch {
	case !podman:
		opts = append(opts, "seccomp="+string(profile))
	case b.localEngine():
		path, err := writeProfile(b.stateDir, profile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, "seccomp="+path)
	}
	b.secOpts = opts
	return opts, nil
}

// writeProfile stores profile under dir (the temporary directory without
// one) by its hash, so concurrent runtimes agree on the file: written to
// a temporary name, then renamed.
func writeProfile(dir string, profile []byte) (string, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	sum := sha256.Sum256(profile)
	path := filepath.Join(dir, "boxrt-seccomp-"+hex.EncodeToString(sum[:8])+".json")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp, err := os.CreateTemp(dir, ".boxrt-seccomp-*")
	if err != nil {
		return "", boxerr.Failure("docker: cannot write the seccomp profile for Podman in %s: %v", dir, err).Wrap(err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(profile)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return "", boxerr.Failure("docker: cannot write the seccomp profile for Podman in %s: %v", dir, err).Wrap(err)
	}
	return path, nil
}
