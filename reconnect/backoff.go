package reconnect

import "time"

// backoffBase is the un-jittered wait after failures consecutive failed
// attempts (failures ≥ 1): initial, doubling per failure, capped at max.
// With the defaults: 3, 6, 12, 24, 48, 60, 60, … seconds.
func backoffBase(failures int, initial, max time.Duration) time.Duration {
	if failures < 1 || initial <= 0 {
		return 0
	}
	d := initial
	for i := 1; i < failures; i++ {
		if d >= max/2 { // doubling again would pass the cap (or overflow)
			return max
		}
		d *= 2
	}
	if d > max {
		return max
	}
	return d
}

// backoffDelay applies the jitter rule to backoffBase: the wait is
// base × (1 + jitter × u) for u uniform in [-1, 1), so with the default
// jitter of 0.2 every wait lies in [0.8 × base, 1.2 × base). Jitter is
// applied after the cap, so at the cap waits spread over 48–72 s; this keeps
// many hosts that lost the same runtime from reconnecting in lockstep,
// which a cap that swallowed the jitter would not.
func backoffDelay(failures int, initial, max time.Duration, jitter, u float64) time.Duration {
	base := backoffBase(failures, initial, max)
	if jitter <= 0 {
		return base
	}
	return time.Duration(float64(base) * (1 + jitter*u))
}
