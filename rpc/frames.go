package rpc

import "sync"

// frameRecycler is a Codec whose frames are buffers of its own, never
// shared with anything else, which the loop hands back once written.
type frameRecycler interface {
	recycle(frame []byte)
}

// Large frames are recycled: streamed exec output sends a frame of ~17 KiB
// per chunk, and fresh memory for each (page faults, GC work, the
// scavenger returning it to the system) cost more than encoding it. Small
// frames are cheap to allocate and not worth the pool's bookkeeping.
const (
	recycleMin   = 4 << 10
	recycleMax   = 256 << 10
	recycleRound = 8 << 10 // capacities are rounded up to this, so frames of similar size share buffers
)

var framePool sync.Pool // of *[]byte

// newFrame returns an empty buffer for a frame of about n bytes.
func newFrame(n int) []byte {
	if n < recycleMin || n > recycleMax {
		return make([]byte, 0, n)
	}
	if p, ok := framePool.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]byte, 0, (n+recycleRound-1)/recycleRound*recycleRound)
}

// recycleFrame takes back a frame nobody references any more.
func recycleFrame(f []byte) {
	if c := cap(f); c >= recycleMin && c <= recycleMax {
		// A variable of the branch's own: the parameter, had its address
		// been taken, would be moved to the heap for every frame.
		kept := f[:0]
		framePool.Put(&kept)
	}
}
