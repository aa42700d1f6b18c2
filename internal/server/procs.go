package server

import (
	"os"
	"runtime"
)

// minProcs is the fewest Ps (GOMAXPROCS) boxrt serves with. With one P —
// what the Go runtime picks when boxrt may use one CPU, by affinity or by
// a cgroup quota — the goroutine reading stdin holds the only P while it
// waits in read(2); after 20 µs the runtime's monitor takes the P back and
// starts another thread to look for work, and the answer waits behind
// those switches. With a second P idle the monitor leaves a waiting read
// alone. Measured with the caller and the server on one CPU (the bench's
// ping scenario, "on one CPU" row): boxrt at 1.16–1.58× the echo peer's
// p50 with one P, 0.52–0.89× with two or three (where_time_goes.md in
// test/bench).
const minProcs = 2

// procsFor is the GOMAXPROCS boxrt sets, given the runtime's choice and
// the GOMAXPROCS environment variable, or 0 to leave it: an operator's
// explicit setting always stands.
func procsFor(current int, env string) int {
	if env != "" || current >= minProcs {
		return 0
	}
	return minProcs
}

// ensureProcs raises GOMAXPROCS to minProcs where the runtime chose fewer,
// and returns the value it replaced (0: left alone). Setting it stops the
// runtime from following later changes of the CPU quota, which only
// matters for a quota raised past minProcs while boxrt runs.
func ensureProcs() (replaced int) {
	current := runtime.GOMAXPROCS(0)
	n := procsFor(current, os.Getenv("GOMAXPROCS"))
	if n == 0 {
		return 0
	}
	runtime.GOMAXPROCS(n)
	return current
}
