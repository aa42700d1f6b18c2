package actions

import (
	"sync"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// Fence is the generation fence: for each (instance, Workspace) the
// highest placement generation seen. A lower one is stale; a higher one
// advances the record, and the older generation's sessions are retired
// (which ends their managed processes and so their relays). One fence
// serves every connection and the relay of a process.
type Fence struct {
	mu       sync.Mutex
	gens     map[fenceKey]int64
	capacity func() int
}

type fenceKey struct{ instance, workspace string }

// NewFence returns a fence holding at most capacity() Workspaces
// (limits.max_admission_records, read on each new Workspace).
func NewFence(capacity func() int) *Fence {
	return &Fence{gens: map[fenceKey]int64{}, capacity: capacity}
}

// errStale is the reference's refusal of an older generation.
func errStale() error { return boxerr.Permission("Stale Box placement generation") }

// Observe records p's generation. advanced is true when it is higher than
// the one held (or the first seen), so the caller retires older sessions.
func (f *Fence) Observe(p tenant.Placement) (advanced bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := fenceKey{p.Instance, p.Workspace}
	cur, ok := f.gens[k]
	switch {
	case !ok:
		if len(f.gens) >= f.capacity() {
			return false, boxerr.Permission("Box generation fence capacity reached; refusing an unbounded Workspace allocation")
		}
	case p.Generation < cur:
		return false, errStale()
	case p.Generation == cur:
		return false, nil
	}
	f.gens[k] = p.Generation
	return true, nil
}

// Current returns the generation held for p's Workspace (0: none).
func (f *Fence) Current(p tenant.Placement) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gens[fenceKey{p.Instance, p.Workspace}]
}

// Holds reports whether the fence holds exactly p's generation: what the
// relay requires before it bridges a process of p.
func (f *Fence) Holds(p tenant.Placement) bool { return f.Current(p) == p.Generation }
