package main

// bwrapCostNotes says where a bwrap exec's and a new bwrap session's time
// goes, layer by layer, as measured while tuning the backend (2026-11-23,
// this 2-core machine, cgroup v1, other engineers' work running: the
// 1-minute load average was 2-8). They are fixed text, not this run's
// measurements: the scenario rows are.
var bwrapCostNotes = []string{
	"**bwrap: where the time goes** (measured 2026-11-23 by timing each step in-process and with `strace -f -tt`; " +
		"2 cores shared with other work, so ±1 ms). A warm exec of `true` is one bwrap run (~7 ms here, the bare row) plus " +
		"boxrt's own steps: session lookup, layout and mount-point checks ~0.03 ms; bwrap options, seccomp and argument " +
		"memfds ~0.1-0.2 ms; placing bwrap into the session's cgroup ~0.05 ms (a locked thread moved into the three v1 " +
		"hierarchies for the fork and back); reading bwrap's init pid from --info-fd and reaping init afterwards (off the " +
		"answer's path); JSON-RPC and the runtime's bookkeeping ~0.1-0.3 ms. Measured inside one process the backend came " +
		"to 0.2-0.5 ms over bare bwrap; over stdio the gap is larger (about 2 ms at p50), and that difference was not " +
		"pinned down.",
	"What it cost before (same machine): a cgroup made and removed per exec in each of three v1 hierarchies, " +
		"0.35-0.6 ms to make and 5.5 ms p50 to remove (rmdir waited, in 10 ms steps, for bwrap's orphaned init, " +
		"which the host's pid 1 reaps lazily), plus a shell that joined the cgroups and then exec'd bwrap (~1 ms): " +
		"about 7 ms of a 15 ms exec. Now each session has one cgroup, made on its first exec (~0.4 ms) and removed " +
		"with the session; its limits bound all its execs together, as a container's do. A killed exec is still " +
		"ended precisely: its pid namespace's init is SIGKILLed and boxrt waits until the kernel has reaped the whole " +
		"namespace. boxrt is a child subreaper and reaps each init itself, so dying inits do not pile up against the " +
		"session's pids limit.",
	"A new bwrap session before its first exec cost (before): mkfs.ext4 of the 1 GiB sparse image ~14-20 ms, " +
		"mount -o loop ~5-15 ms (mount(8) is a process of its own), a dry-run bwrap ~9-11 ms, state and stage " +
		"~0.5 ms. Now: the dry run runs only for sessions that bind directories of the caller's (image, host_path, " +
		"extra mounts); default-size disks come from a pool of two kept ready by a background refill (sparse copy of a " +
		"template formatted once ~0.3 ms, LOOP_CONFIGURE ~1 ms, fsopen/fsmount of the ext4 ~6 ms, kept as a detached " +
		"mount), and taking one is a rename and a move_mount; StartSession then takes ~0.3-0.4 ms. The floor of a disk " +
		"made on demand is that ~7.5 ms (the ext4 mount alone ~6 ms); the bare-bwrap baseline makes no disk. The rest " +
		"of the new-session gap is the session cgroup's creation on the first exec (~0.4 ms), the runtime's session " +
		"table and state file, and the same unexplained ~2 ms as the warm exec.",
}
