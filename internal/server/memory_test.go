package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Memory is released once, when the allocation rate falls from a burst to
// idle; never in steady state, busy or idle.
func TestBurstReleaser(t *testing.T) {
	var total uint64
	released := 0
	r := &burstReleaser{allocated: func() uint64 { return total }, release: func() { released++ }}
	step := func(alloc uint64) bool { total += alloc; return r.check() }

	assert.False(t, step(100<<10), "idle")
	assert.False(t, step(200<<10), "idle")
	assert.False(t, step(3<<20), "moderate traffic is no burst")
	assert.False(t, step(200<<10))
	assert.False(t, step(64<<20), "a burst")
	assert.False(t, step(64<<20), "still bursting")
	assert.False(t, step(8<<20), "winding down, not quiet yet")
	assert.True(t, step(300<<10), "quiet after the burst: release")
	assert.False(t, step(100<<10), "once per burst")
	assert.False(t, step(0))
	assert.Equal(t, 1, released)

	assert.False(t, step(40<<20))
	assert.True(t, step(0), "the next burst is released too")
	assert.Equal(t, 2, released)
}

// The real reader sees this process's allocations.
func TestBurstReleaserReadsAllocations(t *testing.T) {
	r := newBurstReleaser()
	before := r.allocated()
	sink := make([][]byte, 0, 64)
	for range 64 {
		sink = append(sink, make([]byte, 1<<20))
	}
	assert.Len(t, sink, 64)
	assert.GreaterOrEqual(t, r.allocated()-before, uint64(64<<20))
}
