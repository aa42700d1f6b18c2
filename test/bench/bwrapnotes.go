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
		"to 0.2-0.5 ms over bare bwrap; over stdio the gap is larger (about 2 ms at p50): see the next paragraph.",
	"**Where the stdio gap goes** (measured 2026-11-23 with timestamps at each step of one box_exec inside boxrt, " +
		"100 warm execs of `true` per run, three runs interleaved with 100 bare bwrap spawns timed the same way from " +
		"Go; load average ~3.5, so ±0.3 ms). p50 per step: the rpc loop from the request's line to the handler " +
		"~0.03 ms; actions and runtime (session lookup, locks) to the backend ~0.09 ms; session layout, mount-point " +
		"checks, seccomp and argument memfds, the two cgroup counter reads ~0.17 ms; after bwrap exits, the two " +
		"counter reads again and the run's bookkeeping ~0.07 ms; the runtime's log line and result ~0.05 ms; " +
		"encoding and writing the answer ~0.04 ms: about 0.45 ms of boxrt's own work, none of it waiting on a " +
		"timer, a poll interval or another goroutine (the answer is written the moment bwrap and its pipes are " +
		"done). The rest is bwrap itself: (1) starting it (fork plus exec, with the forking thread moved into the " +
		"session's three v1 cgroups and back) was 0.5-1.0 ms at p50 like a bare start (0.3-1.2 ms), but its p90 was " +
		"2-9 ms against ~1.9 ms: moving a thread into a v1 memory cgroup waits for an RCU grace period whenever the " +
		"kernel's cgroup migration lock has gone idle since the last move — 10-20 ms, measured outside boxrt with " +
		"a plain write to `tasks` after a 20 ms pause, 0.01 ms back to back — which is the tail, not the median; " +
		"(2) the same bwrap command ran 0.4-1.0 ms longer from start to exit-and-pipes-closed inside the session " +
		"(6.7-7.1 ms p50 against 5.7-6.3 ms bare, every run): it runs in the session's memory, pids and cpu cgroups " +
		"(not throttled: cpu.stat showed nr_throttled 0), with --info-fd, and its mount namespace holds the " +
		"session's disk and stage, so tearing it down does more. Over the wire those runs came to 7.96-9.71 ms p50 " +
		"against 6.8-7.0 ms bare (1.16-1.4×). Not yet tried: a thread parked in the session's cgroups for the " +
		"session's lifetime (no migration per exec), and attributing (2) between the cgroups and the mounts.",
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
