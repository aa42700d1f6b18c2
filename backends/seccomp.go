package backends

// ModeArgument is, per syscall that sets a file's mode, which argument
// holds the mode. Both the bwrap filter and the docker profile deny these
// calls when the mode carries S_ISUID or S_ISGID: a writable host
// directory must never receive a setuid or setgid file, which outside the
// sandbox would be a setuid program of its owner (root, with
// docker.user "0:0" or bwrap's idmapped clones).
var ModeArgument = map[string]uint{
	"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2,
	"creat": 1, "open": 2, "openat": 3, "mknod": 1, "mknodat": 2,
}

// AFVsock is socket(2)'s AF_VSOCK: a channel to the hypervisor and other
// guests that no namespace confines, denied on every backend whatever
// the session's network setting.
const AFVsock = 40
