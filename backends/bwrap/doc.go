// Package bwrap is the bubblewrap backend: daemonless sandboxes built from
// Linux namespaces, the embedded default on a machine without a container
// engine.
//
// A session is a state directory,
// <StateDir>/bwrap/<InstanceID>/<sanitised id>-<8 hex>/, holding
// session.json (the backends.Session, from which Adopt rebuilds
// sessions after a restart) and, as root, disk.img: the session's own ext4
// filesystem (workspace/, tmp/, home/; workspace_quota_mb, DefaultQuotaMB
// when 0), loop-mounted once per session (disk.go). As root, everything a
// session's sandboxes bind — its disk, clones of its host directories, its
// network namespace — is mounted in its stage,
// /run/boxrt/bwrap/<InstanceID>/<session dir>/ (stage.go). Nothing runs
// between commands except a network: on session's slirp4netns (net.go).
//
// Host directories (host_path, extra mounts, skills, a rootfs image) are
// opened once per session and mode (ro, rw) without following symlinks
// and only ever mounted from that descriptor; mount points inside other
// mounts and the working directory are created below their parent's
// descriptor, never through a symlink (mounts.go).
//
// Every exec and every managed process is a fresh bwrap process, run as
// the unprivileged host user SandboxUser (identity.go):
//
//   - --unshare-all (user, pid, net, ipc, uts, cgroup namespaces) plus
//     --disable-userns when a user namespace of our own is available, and
//     uid 0 inside it; with network on, bwrap is started inside the
//     session's network namespace and shares that one (never the host's);
//   - --die-with-parent and --new-session, --cap-drop ALL, --clearenv with
//     a fixed PATH, HOME=/home and the request's env;
//   - the host's /usr, /bin, /sbin, /lib* and a short list of /etc
//     essentials read-only (resolv.conf naming slirp's DNS with network),
//     or, when the image is an absolute path to a directory, that rootfs
//     read-only;
//   - a new /proc and /dev, the session's tmp at /tmp and home at /home,
//     the workspace at mount_path (the session's own or the host path with
//     its mode) and the extra mounts with their modes;
//   - the root remounted read-only: read_only_rootfs always holds;
//   - /proc/sys, /proc/sysrq-trigger and friends bound read-only and
//     /proc/kcore, /proc/keys… masked, as runc does;
//   - a seccomp filter equivalent to Docker's default deny list, compiled
//     once per process (seccomp.go).
//
// bwrap's options travel through --args on a memfd, so env values never
// appear on a host command line.
//
// Limits use cgroups below <hierarchy>/boxrt/<InstanceID>/ (v1: inside
// boxrt's own cgroup of each hierarchy when writable): one per session,
// <session dir>.<backend token>.s, made on the session's first exec and
// shared by all its execs (sessionFiles.cgroup), and one per managed
// process, <session dir>.<backend token>.p<n>: cgroup v2 (memory.max,
// memory.swap.max=0, pids.max, cpu.max) when the unified hierarchy has the
// controllers, else cgroup v1 (memory and memsw, pids.max, CFS quota), else
// none (Describe then reports no enforced limits). Placement is race-free:
// on v2 bwrap is cloned directly into its cgroup (CLONE_INTO_CGROUP; a
// shell joins and execs bwrap on kernels without it); on v1 bwrap is
// forked by a thread moved into the cgroup for that (cgroup.enterThread).
// boxrt is a child subreaper and reaps each sandbox's namespace init
// itself, which outlives bwrap by a few milliseconds (reap.go).
//
// Default-size disks come from a pool kept ready in the background
// (diskpool.go): copies of a template formatted once, mounted detached.
//
// Killing (timeout, cancellation, StopSession, Signal(SIGKILL)) ends the
// pid namespace's init, whose death takes every process of the sandbox:
// bwrap is stopped, its init SIGKILLed directly and bwrap killed, and the
// kill returns once init, and with it the namespace, is gone; a managed
// process's own cgroup is also killed (v2 cgroup.kill) and swept, then
// removed. The session's cgroup is never swept for one exec. Without
// cgroups the pid namespace alone still guarantees that
// nothing survives. A timeout only ends the command: the session directory
// stays. Signal with any other signal reaches every process of the
// sandbox except bwrap and its init, so a managed process can shut down
// gracefully. StopSession also detaches the session's stage (its disk and
// loop device go with it) and removes its directory.
package bwrap
