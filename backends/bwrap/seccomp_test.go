package bwrap

import (
	"encoding/binary"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestSeccompProgram runs the compiled filter in a BPF interpreter over
// seccomp_data records: what it denies, what it lets through, and that
// another ABI cannot bypass it.
func TestSeccompProgram(t *testing.T) {
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	var insns []bpf.Instruction
	for i := 0; i+8 <= len(prog); i += 8 {
		insns = append(insns, bpf.RawInstruction{
			Op: binary.NativeEndian.Uint16(prog[i:]), Jt: prog[i+2], Jf: prog[i+3],
			K: binary.NativeEndian.Uint32(prog[i+4:]),
		}.Disassemble())
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	native, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	const (
		allow  = uint32(seccomp.ActionAllow)
		eperm  = uint32(seccomp.ActionErrno) | uint32(unix.EPERM)
		enosys = uint32(seccomp.ActionErrno) | uint32(unix.ENOSYS)
	)
	nr := func(name string) uint32 {
		n, ok := native.SyscallNames[name]
		if !ok {
			t.Fatalf("no syscall %s on %s", name, native.Name)
		}
		return uint32(n)
	}
	cases := []struct {
		name string
		arch uint32
		nr   uint32
		arg0 uint64
		want uint32
	}{
		{"read", uint32(native.ID), nr("read"), 0, allow},
		{"execve", uint32(native.ID), nr("execve"), 0, allow},
		{"io_uring_setup", uint32(native.ID), nr("io_uring_setup"), 1, eperm},
		{"keyctl", uint32(native.ID), nr("keyctl"), 0, eperm},
		{"bpf", uint32(native.ID), nr("bpf"), 0, eperm},
		{"perf_event_open", uint32(native.ID), nr("perf_event_open"), 0, eperm},
		{"userfaultfd", uint32(native.ID), nr("userfaultfd"), 0, eperm},
		{"unshare", uint32(native.ID), nr("unshare"), unix.CLONE_NEWUSER, eperm},
		{"mount", uint32(native.ID), nr("mount"), 0, eperm},
		{"open_by_handle_at", uint32(native.ID), nr("open_by_handle_at"), 0, eperm},
		{"clone of a thread", uint32(native.ID), nr("clone"), unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND, allow},
		{"clone into a new user namespace", uint32(native.ID), nr("clone"), unix.CLONE_NEWUSER, eperm},
		{"clone into a new network namespace", uint32(native.ID), nr("clone"), unix.CLONE_NEWNET | uint64(unix.SIGCHLD), eperm},
		{"clone3", uint32(native.ID), nr("clone3"), 0, enosys},
		{"personality query", uint32(native.ID), nr("personality"), 0xffffffff, allow},
		{"personality linux", uint32(native.ID), nr("personality"), 0, allow},
		{"personality ADDR_NO_RANDOMIZE", uint32(native.ID), nr("personality"), 0x0040000, eperm},
		{"socket AF_INET", uint32(native.ID), nr("socket"), unix.AF_INET, allow},
		{"socket AF_VSOCK", uint32(native.ID), nr("socket"), unix.AF_VSOCK, eperm},
		{"another ABI", uint32(native.ID) ^ 0x1, nr("read"), 0, enosys},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// struct seccomp_data, each 32-bit word big-endian: the
			// interpreter loads in network byte order where the kernel
			// loads in native order.
			data := make([]byte, 64)
			binary.BigEndian.PutUint32(data[0:], tc.nr)
			binary.BigEndian.PutUint32(data[4:], tc.arch)
			binary.BigEndian.PutUint32(data[16:], uint32(tc.arg0))
			binary.BigEndian.PutUint32(data[20:], uint32(tc.arg0>>32))
			got, err := vm.Run(data)
			if err != nil {
				t.Fatal(err)
			}
			if uint32(got) != tc.want {
				t.Fatalf("action %#x, want %#x", got, tc.want)
			}
		})
	}
}
