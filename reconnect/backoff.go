package reconnect

import (
	"time"

	"github.com/boxrt/boxrt/internal/dialout"
)

// backoffBase is the un-jittered wait after failures consecutive failed
// attempts (failures ≥ 1): initial, doubling per failure, capped at max.
// With the defaults: 3, 6, 12, 24, 48, 60, 60, … seconds. The rule is
// dialout's, which a dialing runtime follows too.
func backoffBase(failures int, initial, max time.Duration) time.Duration {
	return dialout.BackoffBase(failures, initial, max)
}

// backoffDelay is the jittered wait (dialout.Backoff): with the default
// jitter of 0.2 every wait lies in [0.8 × base, 1.2 × base), also at the
// cap (48–72 s), so many hosts that lost the same runtime do not reconnect
// in lockstep.
func backoffDelay(failures int, initial, max time.Duration, jitter, u float64) time.Duration {
	return dialout.Backoff(failures, initial, max, jitter, u)
}
