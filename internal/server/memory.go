package server

import (
	"context"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"

	"github.com/rs/zerolog"
)

const (
	// memoryCheckEvery is how often boxrt looks at how much it allocated.
	memoryCheckEvery = 10 * time.Second
	// burstAllocBytes allocated within one check marks a burst (a few
	// hundred concurrent execs allocate hundreds of MiB, 64 execs on 64
	// sessions about 12 MiB spread over one or two checks; an idle boxrt
	// answering heartbeats, a few KiB). Releasing costs a few milliseconds
	// once per burst, so a low bar is cheap.
	burstAllocBytes = 4 << 20
	// quietAllocBytes or less within one check, after a burst, means the
	// burst is over.
	quietAllocBytes = 1 << 20
)

// burstReleaser gives memory back to the system once boxrt goes quiet after
// a burst. Left alone, the Go runtime keeps a burst's heap: with no more
// allocation no collection runs, the heap goal stays where the burst put
// it, and the pages are returned only after the forced collection minutes
// later, so a host sees boxrt's RSS stay at its peak. One FreeOSMemory (a
// full collection plus returning free pages, a few milliseconds on boxrt's
// heap) when the allocation rate falls from burst to idle fixes that
// without costing anything in steady state.
type burstReleaser struct {
	allocated func() uint64 // cumulative bytes allocated
	release   func()
	last      uint64
	busy      bool
}

func newBurstReleaser() *burstReleaser {
	sample := []rtmetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	r := &burstReleaser{
		allocated: func() uint64 {
			rtmetrics.Read(sample)
			return sample[0].Value.Uint64()
		},
		release: debug.FreeOSMemory,
	}
	r.last = r.allocated()
	return r
}

// check looks at the allocations since the last check and releases memory
// when a burst just ended; it reports whether it did.
func (r *burstReleaser) check() bool {
	now := r.allocated()
	delta := now - r.last
	r.last = now
	switch {
	case delta >= burstAllocBytes:
		r.busy = true
	case r.busy && delta <= quietAllocBytes:
		r.busy = false
		r.release()
		return true
	}
	return false
}

// run checks every interval until ctx ends.
func (r *burstReleaser) run(ctx context.Context, every time.Duration, log zerolog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if start := time.Now(); r.check() {
				log.Debug().Dur("took", time.Since(start)).Msg("burst over: returned free memory to the system")
			}
		}
	}
}
