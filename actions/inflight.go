package actions

import (
	"context"
	"errors"
	"sync"

	"github.com/boxrt/boxrt/runtime/tenant"
)

// errRetired is the cancellation cause of a tenant action whose placement
// generation a newer one retired while it ran.
var errRetired = errors.New("placement generation retired")

// inflight tracks the running tenant actions of each Workspace with their
// generation, so a newer generation can cancel the older ones, as the
// reference does.
type inflight struct {
	mu   sync.Mutex
	runs map[fenceKey]map[*inflightRun]struct{}
}

type inflightRun struct {
	generation int64
	cancel     context.CancelCauseFunc
}

// start registers an action of p; done unregisters it. The returned ctx
// is cancelled with errRetired when p's generation is retired.
func (f *inflight) start(ctx context.Context, p tenant.Placement) (_ context.Context, done func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	run := &inflightRun{generation: p.Generation, cancel: cancel}
	k := fenceKey{p.Instance, p.Workspace}
	f.mu.Lock()
	if f.runs == nil {
		f.runs = map[fenceKey]map[*inflightRun]struct{}{}
	}
	if f.runs[k] == nil {
		f.runs[k] = map[*inflightRun]struct{}{}
	}
	f.runs[k][run] = struct{}{}
	f.mu.Unlock()
	return ctx, func() {
		f.mu.Lock()
		delete(f.runs[k], run)
		if len(f.runs[k]) == 0 {
			delete(f.runs, k)
		}
		f.mu.Unlock()
		cancel(nil)
	}
}

// retire cancels the actions of p's Workspace of generations below p's.
func (f *inflight) retire(p tenant.Placement) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for run := range f.runs[fenceKey{p.Instance, p.Workspace}] {
		if run.generation < p.Generation {
			run.cancel(errRetired)
		}
	}
}

// retired reports whether ctx's action was cancelled by a newer generation.
func retired(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errRetired) }
