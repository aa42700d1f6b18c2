package main

// bwrapCostNotes says where a bwrap exec's and a new bwrap session's time
// goes, layer by layer, as measured while tuning the backend (2026-11-23,
// this 2-core machine, cgroup v1, other engineers' work running: the
// 1-minute load average was 2-8). They are fixed text, not this run's
// measurements: the scenario rows are. They describe the design before
// the resident sandbox (a bwrap per exec), and say so.
var bwrapCostNotes = []string{
	"**bwrap: where the time went with a sandbox per exec** (the design before each session became one resident sandbox " +
		"entered through its agent; measured 2026-11-23 by timing each step in-process and with `strace -f -tt`; " +
		"2 cores shared with other work, so ±1 ms). A warm exec of `true` is one bwrap run (~7 ms here, the bare row) plus " +
		"boxrt's own steps: session lookup, layout and mount-point checks ~0.03 ms; bwrap options, seccomp and argument " +
		"memfds ~0.1-0.2 ms; placing bwrap into the session's cgroup ~0.05 ms (a locked thread moved into the three v1 " +
		"hierarchies for the fork and back); reading bwrap's init pid from --info-fd and reaping init afterwards (off the " +
		"answer's path); JSON-RPC and the runtime's bookkeeping ~0.1-0.3 ms. Measured inside one process the backend came " +
		"to 0.2-0.5 ms over bare bwrap; over stdio the gap is larger (about 2 ms at p50): see the next paragraph.",
	"**Where the stdio gap goes** (measured 2026-11-23 with timestamps at each step of one box_exec inside boxrt, " +
		"and with a driver that alternates, call by call, a bare bwrap spawn and box_exec over stdio to one or two " +
		"boxrt processes; load average ~3.5, so ±0.3 ms). boxrt's own steps, p50: the rpc loop from the request's " +
		"line to the handler ~0.03 ms; actions and runtime (session lookup, locks) to the backend ~0.09 ms; session " +
		"layout, mount-point checks, seccomp and argument memfds, two cgroup counter reads ~0.17 ms; after bwrap " +
		"exits, the counters again and the run's bookkeeping ~0.07 ms; the runtime's log line and result ~0.05 ms; " +
		"encoding and writing the answer ~0.04 ms: about 0.45 ms, none of it waiting on a timer, a poll interval or " +
		"a goroutine handoff (the answer is written as soon as bwrap has exited and its pipes are closed). The " +
		"rest, and all of the variance, was the one cgroup step: on v1 the thread that forks bwrap is moved into " +
		"the session's memory, pids and cpu cgroups and back (cgroup.enterThread), and a move waited for an RCU " +
		"grace period (~6-15 ms here) whenever the kernel's cgroup migration lock had been idle for a grace period " +
		"or two. Timed inside boxrt: with execs back to back (~8 ms apart) the move took 0.09 ms p50, 0.2 ms p90; " +
		"with a bare bwrap spawn between two execs (~15 ms apart) 0.1 ms p50 but 6.1 ms p75 and 10.1 ms p90, so " +
		"a host whose execs are spaced out paid a grace period on most of them, and the new-session row, whose " +
		"exec follows a bare spawn and a delete, on a good share of its samples. The lock is the kernel's global " +
		"cgroup_threadgroup_rwsem, a percpu rwsem whose write side waits a grace period after idle; it is taken " +
		"because the thread was named by its id. A thread that names itself (`0`) cannot exit or exec during " +
		"its own move, and the kernel (cgroup_procs_write_start) then skips the lock: writing `0` instead of the " +
		"thread id into the three `tasks` files and back is what boxrt does now. Measured outside boxrt (a locked " +
		"thread moved into fresh memory, pids and cpu cgroups and back, 15-50 ms apart, load average 4-7): by id " +
		"0.17-13 ms p50, 0.3-41 ms p90; as `0` 0.14-0.2 ms p50, 0.16-4 ms p90. Inside boxrt, `strace -f -T` of the " +
		"session scenario (2 repetitions, same load): the `tasks` writes went from 0.049 ms p50, 7.1 ms p90, " +
		"20.7 ms max, 440 ms in all to 0.036 ms p50, 0.077 ms p90, 0.7 ms max, 16 ms in all. (Kernels without " +
		"that shortcut take the lock for `0` too: never slower.) The parked-forker and pre-made-cgroup ideas " +
		"were therefore not needed. Ruled out earlier by alternating bare spawns call by call (each within " +
		"±0.1 ms of plain): running bwrap inside memory, pids and cpu cgroups (no throttling: nr_throttled 0), " +
		"--info-fd, boxrt being a child subreaper, and the workspace, /tmp and /home on an ext4 loop disk. No " +
		"migration happens on cgroup v2, where bwrap is cloned straight into the session's cgroup " +
		"(CLONE_INTO_CGROUP; this machine is v1).",
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
		"made on demand is that ~7.5 ms (the ext4 mount alone ~6 ms); the bare-bwrap baseline makes no disk. " +
		"Timed in-process after the cgroup fix (60 sessions alternating with bare spawns, load average ~5): " +
		"StartSession 1.1-1.5 ms p50 under that load (directory, pooled disk, state file, layout), then a first exec no slower " +
		"than a second one in the same session (20.3 vs 20.3 ms p50 under that load) and no slower when it " +
		"waited 150 ms for the pool's refill to finish (22.4 ms): the refill does not compete measurably. " +
		"The session cgroup's creation on the first exec is ~0.45-0.55 ms p50 (mkdir in three hierarchies " +
		"~0.15-0.3 ms, limits ~0.15 ms), which a pool of pre-made cgroups could save at most; the rest of " +
		"the gap is the runtime's session table and state file and the stdio round trip. The session scenario, " +
		"run alternately with the binary before and after the fix (7 runs each, `-reps 5`, load average 4-7, " +
		"ratio to bare bwrap in the same run): before 1.32-2.01×, median 1.65×; after 1.20-1.91×, median 1.24× " +
		"(the 1.91× run met a load spike: bare bwrap itself was at 20.8 ms).",
	"**bwrap: where a warm exec's time goes in the resident sandbox** (measured 2026-12-07 with wall-clock " +
		"timestamps at each step in boxrt and in the agent, 200 execs of `true`, load average ~15, p50 in µs). " +
		"boxrt before the spawn ~160: the rpc loop to its handler 27, actions to the runtime 39, the runtime to the " +
		"backend 37, session lookup, layout, pipes and the spawn frame 57. The spawn frame reaching the agent 107; " +
		"decoding and checking it 33; fork and exec of `/bin/sh` (Go's ForkExec, vfork until the new image) 385; " +
		"the shell running `true` until the agent's wait4 returns 715; the exited frame 13 and reaching boxrt's " +
		"reader 160; the backend's end (counters, pipes) 39, the runtime's result 25, the answer's encoding 8 and " +
		"write 77. boxrt's \"started\" (~100-700) overlaps the shell's run. `sh -lc true` costs what `sh -c true` does " +
		"in a session (~0.9 ms each from a shell inside it): the sandbox has no /etc/profile and no /home/.profile. " +
		"Cut on 2026-12-07 (interleaved A/B, 14 pairs of 400 execs, load 15-27: p50 0.87-0.95×, median 0.90×): the " +
		"cgroup counters read with one pread on descriptors held while the sandbox runs (os.ReadFile's open, poller " +
		"registration and close were ~13% of boxrt's CPU per exec); the command's pipes made with their child ends " +
		"outside the poller and /dev/null opened once; no goroutine per wait; the agent waiting in wait4 instead of " +
		"for SIGCHLD through the runtime's signal thread; host-path roots (symlink resolution) resolved only for a " +
		"spec that names a host path. A new session's first output is dominated by the agent's own start: the " +
		"agent is boxrt's binary, whose package initialisation (266 inits, Kubernetes and Docker clients among them) " +
		"takes ~10 ms of CPU and ~20 ms of wall time at start, before bwrap's namespace setup is even counted.",
}
