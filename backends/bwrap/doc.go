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
// session's sandbox binds — its disk, clones of its host directories, its
// network namespace, the agent binary — is mounted in its stage,
// /run/boxrt/bwrap/<InstanceID>/<session dir>/ (stage.go), which also
// holds the agent's socket directory (agent/). bwrap is started from a
// mount namespace holding that one stage, not boxrt's, which holds them
// all (mountns.go).
//
// A session is one resident sandbox (resident.go): a bwrap started when
// the session is created (StartSession) whose command is the
// session agent (internal/sandboxagent: boxrt's own binary bound read-only
// at /run/boxrt-agent/boxrt, running `boxrt agent`, pid 2 under bwrap's
// init), connected back to a socket boxrt listens on in the stage (bound
// read-only at /run/boxrt-agent/sock). Every exec and managed process is
// started by the agent inside it, as a session leader with the
// pipes or terminal boxrt made (only the command's ends enter the
// sandbox; a terminal is opened in the sandbox's own devpts: pty.go). So
// what a command leaves running is there for the next one, and a session's
// processes share one pid namespace, one set of mounts and one loopback.
// A sandbox whose agent died or broke the protocol is killed and started
// again on the next call, which says Restarted; so is one whose mounts
// changed (a new skill, a host directory re-created). A sandbox idle for
// Config.IdleRelease (no call, no process of the session's own in its
// cgroup) is stopped to free the host's memory and started again, without
// Restarted, by the next call (idle.go). Nothing but the sandboxes runs
// for a session: its network, if any, is boxrt's egress proxy (net.go).
//
// Host directories (host_path, extra mounts, skills, a rootfs image) are
// opened once per session and mode (ro, rw) without following symlinks
// and only ever mounted from that descriptor; mount points inside other
// mounts and the working directory are created below their parent's
// descriptor, never through a symlink (mounts.go).
//
// The sandbox is a bwrap process run as the unprivileged host user
// SandboxUser (identity.go):
//
//   - --unshare-all (user, pid, net, ipc, uts, cgroup namespaces) plus
//     --disable-userns when a user namespace of our own is available, and
//     uid 0 inside it; with network on, bwrap is started inside the
//     session's network namespace and shares that one (never the host's);
//   - --die-with-parent unless the session is persistent (whose sandbox
//     outlives boxrt and is adopted by the next: persist.go), --new-session,
//     --cap-drop ALL, --clearenv with a fixed PATH and HOME=/home; each
//     command gets that environment plus the request's env from the agent;
//   - the host's /usr, /bin, /sbin, /lib* and a short list of /etc
//     essentials read-only (resolv.conf naming the proxy's DNS with network),
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
// <session dir>.<backend token>.s, holding the resident sandbox and with
// it every exec and managed process of the session (a managed process's
// memory_mb is not applied): cgroup v2 (memory.max, memory.swap.max=0,
// pids.max, cpu.max) when the unified hierarchy has the controllers, else
// cgroup v1 (memory and memsw, pids.max, CFS quota), else none (Describe
// then reports no enforced limits). Placement is race-free: on v2 bwrap is
// cloned directly into its cgroup (CLONE_INTO_CGROUP; a shell joins and
// execs bwrap on kernels without it); on v1 bwrap is forked by a thread
// moved into the cgroup for that (cgroup.enterThread). The leaf's pids
// limit leaves room for bwrap and the agent's threads (pidsOverhead), which
// share the leaf with the session's commands on v1 as on v2: a command is
// born where the agent is, and nothing is moved between cgroups after
// the start (on v1 a move by pid waits for a kernel RCU grace period,
// ~7-11 ms here, which a new session paid once when the agent had a
// child cgroup of its own).
// boxrt is a child subreaper and reaps each sandbox's namespace init
// itself, which outlives bwrap by a few milliseconds (reap.go).
//
// Default-size disks come from a pool kept ready in the background
// (diskpool.go): copies of a template formatted once, mounted detached.
//
// A timeout, a cancellation or a kill of one command signals that
// command's process group through the agent, and boxrt SIGKILLs every
// process below the command (setsid'd ones too) from the host (a live
// exec's group is also swept when it ends, as on docker); a command not
// gone killGrace after
// its SIGKILL (the agent stuck or hostile) gets the whole sandbox killed
// from the host, reported as Restarted. Killing the sandbox (that,
// StopSession, Suspend) ends the pid namespace's init, whose death takes
// every process of the sandbox: bwrap is stopped, its init SIGKILLed
// directly and bwrap killed, and the kill returns once init, and with it
// the namespace, is gone. Without cgroups the pid namespace alone still
// guarantees that nothing survives. StopSession also detaches the
// session's stage (its disk and loop device go with it) and removes its
// directory. When many sessions go at once (exit, box_shutdown), the
// runtime first calls KillSandboxes, which SIGKILLs every process of
// their cgroups in one pass; each StopSession then finds its sandbox
// dead, and neither it nor the stage's removal scans /proc or the mount
// table, which hold every session's processes and mounts.
package bwrap
