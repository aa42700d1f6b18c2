package reconnect

import "time"

// Clock is the time source for the heartbeat schedule, ping timeouts and
// reconnect backoff. Tests inject a fake one (WithClock) to step through a
// 60-second backoff without waiting for it. Operating-system timeouts —
// stopping a child, write deadlines, the connect timeout — use real time,
// because the things they wait for run on real time too.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that delivers once on C after d.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine after d, unless stopped.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable one-shot timer.
type Timer interface {
	// C is the delivery channel; nil for AfterFunc timers.
	C() <-chan time.Time
	// Stop prevents the timer from firing; false if it already fired or
	// was stopped.
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }
