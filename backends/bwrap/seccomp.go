package bwrap

import (
	"encoding/binary"
	"maps"
	"os"
	"slices"
	"sync"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// The syscall filter every sandboxed command runs under (bwrap --seccomp,
// loaded right before the command is executed, after bwrap's own setup).
// It denies with EPERM what Docker's default profile denies to a
// container without extra capabilities: kernel keyrings, BPF, perf,
// io_uring, userfaultfd, module and kexec loading, mounting and namespace
// changes, ptrace and cross-process memory access, clock and swap
// changes, file handles (open_by_handle_at), and personality flags other
// than the harmless ones. clone with namespace flags is EPERM; clone3 is
// ENOSYS (its flags sit in memory a filter cannot read), so libc falls
// back to clone. Every syscall of another ABI (32-bit x86, x32) is ENOSYS:
// a deny list is only as good as the one ABI it is written for.
//
// Like Docker's current profile, socket(AF_VSOCK) is EPERM: a vsock
// reaches the hypervisor and other guests past every namespace, network
// off included.
//
// Beyond Docker's list, no file may get a setuid or setgid bit. A
// writable host directory is an idmapped clone in which the sandbox's
// files belong to host root (see idmap.go); a setuid bit there would be a
// setuid-root program on the host, where the clone's nosuid does not
// apply. So every syscall that sets a mode (chmod family, creating opens,
// mknod) is EPERM when the mode carries S_ISUID or S_ISGID, and openat2,
// whose mode sits in memory a filter cannot read, is ENOSYS (libc and Go
// fall back to openat).
var deniedSyscalls = []string{
	"acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "settimeofday",
	"create_module", "delete_module", "finit_module", "init_module", "get_kernel_syms", "query_module",
	"kexec_file_load", "kexec_load", "keyctl", "request_key", "lookup_dcookie",
	"mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
	"fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at", "nfsservctl",
	"perf_event_open", "fanotify_init", "process_vm_readv", "process_vm_writev", "ptrace", "kcmp",
	"quotactl", "reboot", "setns", "unshare", "swapon", "swapoff", "sysfs", "_sysctl", "uselib",
	"userfaultfd", "ustat", "vhangup", "iopl", "ioperm", "syslog",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"get_mempolicy", "set_mempolicy", "mbind", "move_pages",
}

// cloneNamespaceFlags are the CLONE_NEW* bits of clone's first argument.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// allowedPersonalities are the personality(2) values Docker allows: Linux,
// 32-bit Linux, the UNAME26 variants, and the query.
var allowedPersonalities = []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// seccompProgram is the filter as the sock_filter array bwrap reads,
// compiled once per process.
var seccompProgram = sync.OnceValues(buildSeccomp)

func buildSeccomp() ([]byte, error) {
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, err
	}
	var personality seccomp.ArgumentConditions
	for _, v := range allowedPersonalities {
		personality = append(personality, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: v})
	}
	conditional := []seccomp.NameWithConditions{
		{Name: "personality", Conditions: personality},
		{Name: "clone", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNamespaceFlags},
		}},
		{Name: "socket", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.Equal, Value: backends.AFVsock},
		}},
	}
	for _, name := range knownSyscalls(native, slices.Sorted(maps.Keys(backends.ModeArgument))) {
		conditional = append(conditional, seccomp.NameWithConditions{Name: name, Conditions: seccomp.ArgumentConditions{
			{Argument: uint32(backends.ModeArgument[name]), Operation: seccomp.BitsSet, Value: unix.S_ISUID | unix.S_ISGID},
		}})
	}
	policy := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{
				Action:             seccomp.ActionErrno, // EPERM
				Names:              knownSyscalls(native, deniedSyscalls),
				NamesWithCondtions: conditional,
			},
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: knownSyscalls(native, []string{"clone3", "openat2"})},
		},
	}
	insns, err := policy.Assemble()
	if err != nil {
		return nil, err
	}
	// The library lets other ABIs through to the default action; a deny
	// list must not.
	prologue := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(native.ID), SkipTrue: 1},
		bpf.RetConstant{Val: uint32(seccomp.ActionErrno) | uint32(unix.ENOSYS)},
	}
	raw, err := bpf.Assemble(append(prologue, insns...))
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return out, nil
}

// knownSyscalls drops names this architecture does not have (the legacy
// ones of the list exist only on some).
func knownSyscalls(a *arch.Info, names []string) []string {
	var out []string
	for _, n := range names {
		if _, ok := a.SyscallNames[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

// seccompFile is the compiled filter on a memfd for bwrap --seccomp.
func seccompFile() (*os.File, error) {
	prog, err := seccompProgram()
	if err != nil {
		return nil, boxerr.Failure("bwrap: cannot build the syscall filter: %v", err).Wrap(err)
	}
	return memFile("boxrt-seccomp", prog)
}

// memFile is data on an anonymous memory file, positioned at its start,
// for bwrap to read from a descriptor.
func memFile(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, boxerr.Failure("bwrap: memfd %s: %v", name, err).Wrap(err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, boxerr.Failure("bwrap: write %s: %v", name, err).Wrap(err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, boxerr.Failure("bwrap: rewind %s: %v", name, err).Wrap(err)
	}
	return f, nil
}
