package dialout

import "time"

// BackoffBase is the un-jittered wait after failures consecutive failed
// attempts (failures ≥ 1): initial, doubling per failure, capped at max.
func BackoffBase(failures int, initial, max time.Duration) time.Duration {
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
	return min(d, max)
}

// Backoff applies the jitter rule to BackoffBase: the wait is
// base × (1 + jitter × u) for u uniform in [-1, 1), so with a jitter of 0.2
// every wait lies in [0.8 × base, 1.2 × base). Jitter is applied after the
// cap, so many peers that lost the same other end do not retry in
// lockstep even at the cap.
func Backoff(failures int, initial, max time.Duration, jitter, u float64) time.Duration {
	base := BackoffBase(failures, initial, max)
	if jitter <= 0 {
		return base
	}
	return time.Duration(float64(base) * (1 + jitter*u))
}
