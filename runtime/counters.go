package runtime

import "sync/atomic"

// Counters are lifetime totals for box_status.
type Counters struct {
	TotalCreated        int64 `json:"total_created"`
	TotalReused         int64 `json:"total_reused"`
	TotalCleaned        int64 `json:"total_cleaned"`
	TotalReaped         int64 `json:"total_reaped"`
	TotalRecreated      int64 `json:"total_recreated"`
	TotalSuspended      int64 `json:"total_suspended"`
	TotalResumed        int64 `json:"total_resumed"`
	PoolHits            int64 `json:"total_pool_hits"`
	PoolMisses          int64 `json:"total_pool_misses"`
	TotalExecs          int64 `json:"total_execs"`
	TotalTimeouts       int64 `json:"total_timeouts"`
	TotalTruncated      int64 `json:"total_truncated_outputs"`
	ProcessesStarted    int64 `json:"total_processes_started"`
	ProcessesExited     int64 `json:"total_processes_exited"`
	ProcessesReplaced   int64 `json:"total_processes_replaced"`
	HealthCheckFailures int64 `json:"health_check_failures"`
}

// counters are the live totals, counted where each event happens without
// a lock.
type counters struct {
	created, reused, cleaned, reaped, recreated, suspended, resumed atomic.Int64
	poolHits, poolMisses                                            atomic.Int64
	execs, timeouts, truncated                                      atomic.Int64
	processesStarted, processesExited, processesReplaced            atomic.Int64
	healthCheckFailures                                             atomic.Int64
}

func (c *counters) snapshot() Counters {
	return Counters{
		TotalCreated: c.created.Load(), TotalReused: c.reused.Load(), TotalCleaned: c.cleaned.Load(),
		TotalReaped: c.reaped.Load(), TotalRecreated: c.recreated.Load(), TotalSuspended: c.suspended.Load(),
		TotalResumed: c.resumed.Load(), PoolHits: c.poolHits.Load(), PoolMisses: c.poolMisses.Load(),
		TotalExecs: c.execs.Load(), TotalTimeouts: c.timeouts.Load(), TotalTruncated: c.truncated.Load(),
		ProcessesStarted: c.processesStarted.Load(), ProcessesExited: c.processesExited.Load(),
		ProcessesReplaced: c.processesReplaced.Load(), HealthCheckFailures: c.healthCheckFailures.Load(),
	}
}
