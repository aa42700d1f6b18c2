package runtime

import "time"

// Clock abstracts time so reaping and retention are testable.
type Clock interface {
	Now() time.Time
	// NewTicker returns a channel that fires every d and a stop function.
	NewTicker(d time.Duration) (<-chan time.Time, func())
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}
