package rpc

import "sync"

// frameRecycler is a Codec whose frames are buffers of its own, never
// shared with anything else, which the loop hands back once written.
type frameRecycler interface {
	recycle(frame []byte)
}

// Frames are recycled. Streamed exec output sends a frame of ~17 KiB per
// chunk, and fresh memory for each (page faults, GC work, the scavenger
// returning it to the system) cost more than encoding it; large frames go
// through a sync.Pool, which lets the GC take back what sits unused. Small
// frames (a heartbeat's answer is ~40 bytes) go through a short free list
// instead: sync.Pool would allocate a box for every frame it takes back,
// the very allocation recycling saves, and a heartbeat would keep the GC
// running.
const (
	recycleMin   = 4 << 10
	recycleMax   = 256 << 10
	recycleRound = 8 << 10 // capacities are rounded up to this, so frames of similar size share buffers

	smallFrameCap  = 512
	smallFramesMax = 64 // at most 32 KiB kept
)

var (
	framePool sync.Pool // of *[]byte

	smallFrames struct {
		sync.Mutex
		free [][]byte
	}
)

// newFrame returns an empty buffer for a frame of about n bytes.
func newFrame(n int) []byte {
	if n <= smallFrameCap {
		smallFrames.Lock()
		defer smallFrames.Unlock()
		if k := len(smallFrames.free); k > 0 {
			f := smallFrames.free[k-1]
			smallFrames.free = smallFrames.free[:k-1]
			return f
		}
		return make([]byte, 0, smallFrameCap)
	}
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
	switch c := cap(f); {
	case c == smallFrameCap:
		smallFrames.Lock()
		if len(smallFrames.free) < smallFramesMax {
			smallFrames.free = append(smallFrames.free, f[:0])
		}
		smallFrames.Unlock()
	case c >= recycleMin && c <= recycleMax:
		// A variable of the branch's own: the parameter, had its address
		// been taken, would be moved to the heap for every frame.
		kept := f[:0]
		framePool.Put(&kept)
	}
}
