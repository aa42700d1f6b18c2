package actions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// Directory watches: box_fs_watch starts one on the caller's connection
// and answers with its id; changes arrive as box_fs_event notifications on
// that connection until box_fs_unwatch, the connection's end, or the
// directory's or session's end (a last notification with "ended" says
// why). The runtime does the watching (runtime.FileWatch, by polling).

// Watch bounds.
const (
	// MaxWatches bounds the watches of one boxrt (all connections).
	MaxWatches = 64
	// MaxWatchScanRate bounds what all watches cost together, in entries
	// listed per second (a watch's last listing size over its interval):
	// 64 watches polling a 5,000-entry directory every 200 ms held both
	// cores of a small host. A watch that would exceed it is refused; one
	// whose tree grows past it polls less often.
	MaxWatchScanRate = 100000
	// minWatchCost is what a poll counts at least, in entries: listing an
	// empty directory is still a call into the sandbox.
	minWatchCost = 100
	// DefaultWatchInterval is how often a watch polls unless told.
	DefaultWatchInterval = time.Second
	minWatchInterval     = 200 * time.Millisecond
	maxWatchInterval     = time.Minute
	// WatchFailures: consecutive failed polls (other than the directory
	// or session being gone) that end a watch.
	WatchFailures = 5
)

// WatchBudget is the running watches by id, with what each costs
// (entries listed per second, see MaxWatchScanRate). Each belongs to the
// namespace it was made in (tenant.Scope): another namespace's unwatch
// finds none. box_fs_watch and E2B's WatchDir share one.
type WatchBudget struct {
	mu    sync.Mutex
	stop  map[string]watchEntry
	total int
}

type watchEntry struct {
	scope string
	stop  context.CancelFunc
	cost  int
}

// WatchCost is the scan rate of a watch listing entries every interval.
func WatchCost(entries int, interval time.Duration) int {
	return int(int64(max(entries, minWatchCost)) * int64(time.Second) / int64(interval))
}

// Add admits a watch of cost, stopped by stop when removed.
func (s *WatchBudget) Add(id, scope string, stop context.CancelFunc, cost int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.stop) >= MaxWatches {
		return boxerr.CapacityExceeded("max_watches", MaxWatches, "%d directory watches are running (box_fs_unwatch some)", MaxWatches)
	}
	if s.total+cost > MaxWatchScanRate {
		return boxerr.CapacityExceeded("max_watch_scan_rate", MaxWatchScanRate,
			"this watch would list %d entries per second, and the running watches already list %d of at most %d (max_watch_scan_rate): "+
				"watch a smaller tree, a lower depth or a longer interval_ms, or box_fs_unwatch some", cost, s.total, MaxWatchScanRate)
	}
	if s.stop == nil {
		s.stop = map[string]watchEntry{}
	}
	s.stop[id] = watchEntry{scope: scope, stop: stop, cost: cost}
	s.total += cost
	return nil
}

// Update records a watch's new cost and returns by how much its interval
// must stretch for all watches to stay within MaxWatchScanRate (1: not).
func (s *WatchBudget) Update(id string, cost int) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.stop[id]
	if !ok {
		return 1
	}
	s.total += cost - w.cost
	w.cost = cost
	s.stop[id] = w
	return max(1, float64(s.total)/MaxWatchScanRate)
}

// Remove stops and forgets a watch of scope; false when there was none.
func (s *WatchBudget) Remove(id, scope string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.stop[id]
	if ok = ok && w.scope == scope; ok {
		w.stop()
		delete(s.stop, id)
		s.total -= w.cost
	}
	return ok
}

type fsWatchParams struct {
	fsPathParams
	Depth      int `json:"depth"`
	IntervalMS int `json:"interval_ms"`
}

func (p *fsWatchParams) setDefaults() {
	p.Depth = 1
	p.IntervalMS = int(DefaultWatchInterval / time.Millisecond)
}

func (p *fsWatchParams) validate() error {
	if err := p.fsPathParams.validate(); err != nil {
		return err
	}
	if d := time.Duration(p.IntervalMS) * time.Millisecond; d < minWatchInterval || d > maxWatchInterval {
		return boxerr.Validation("interval_ms", "interval_ms must be between %d and %d, got %d",
			minWatchInterval.Milliseconds(), maxWatchInterval.Milliseconds(), p.IntervalMS)
	}
	return nil
}

type fsWatchResult struct {
	WatchID string `json:"watch_id"`
}

// fsEvent is box_fs_event's params.
type fsEvent struct {
	WatchID   string              `json:"watch_id"`
	SessionID string              `json:"session_id"`
	Events    []runtime.FileEvent `json:"events"`
	// Ended says why the watch stopped (its last notification).
	Ended *fsEnded `json:"ended,omitempty"`
}

type fsEnded struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// fsWatch: box_fs_watch {"session_id", "path", "depth"=1,
// "interval_ms"=1000} → {"watch_id"}; then box_fs_event notifications.
func (d *Dispatcher) fsWatch(ctx context.Context, p fsWatchParams) (fsWatchResult, error) {
	w, err := d.rt.Files().Watch(ctx, p.SessionID, p.Path, p.Depth)
	if err != nil {
		return fsWatchResult{}, err
	}
	buf := make([]byte, 16)
	_, _ = rand.Read(buf)
	id := "w-" + hex.EncodeToString(buf)
	// The watch outlives the request and ends with its connection.
	wctx, stop := context.WithCancel(rpc.ConnContext(ctx))
	interval := time.Duration(p.IntervalMS) * time.Millisecond
	scope := tenant.Scope(ctx)
	if err := d.watches.Add(id, scope, stop, WatchCost(w.Entries(), interval)); err != nil {
		stop()
		w.Close()
		return fsWatchResult{}, err
	}
	go func() {
		defer d.watches.Remove(id, scope)
		defer w.Close()
		d.runWatch(wctx, id, scope, p.SessionID, w, interval)
	}()
	return fsWatchResult{WatchID: id}, nil
}

// runWatch polls until the watch is stopped or ends, notifying changes;
// the last notification says why it ended.
func (d *Dispatcher) runWatch(ctx context.Context, id, scope, sessionID string, w *runtime.FileWatch, interval time.Duration) {
	err := d.watches.Run(ctx, id, scope, w, interval, func(events []runtime.FileEvent) error {
		for i := range events {
			events[i].FileInfo = events[i].FileInfo.Encoded()
		}
		return rpc.Notify(ctx, "box_fs_event", fsEvent{WatchID: id, SessionID: sessionID, Events: events})
	})
	if err != nil {
		_ = rpc.Notify(ctx, "box_fs_event", fsEvent{WatchID: id, SessionID: sessionID, Events: []runtime.FileEvent{},
			Ended: &fsEnded{Type: boxerr.TypeOf(err), Message: err.Error()}})
	}
}

// Run polls the watch id (admitted by Add) every interval, stretched to
// keep all watches within MaxWatchScanRate, and hands each poll's changes
// to emit. It returns nil when ctx ends or emit fails (the receiver is
// gone), and the error that ended the watch otherwise (its directory or
// session gone, or WatchFailures failed polls in a row), after removing
// it from the budget, so that a remove sent after the end finds none.
func (s *WatchBudget) Run(ctx context.Context, id, scope string, w *runtime.FileWatch, interval time.Duration, emit func([]runtime.FileEvent) error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		events, err := w.Poll(ctx)
		if ctx.Err() != nil {
			return nil
		}
		stretch := s.Update(id, WatchCost(w.Entries(), interval))
		t.Reset(time.Duration(float64(interval) * stretch))
		if err != nil {
			if failures++; failures < WatchFailures && !errors.Is(err, boxerr.ErrSessionNotFound) && !errors.Is(err, boxerr.ErrFileNotFound) {
				continue
			}
			s.Remove(id, scope)
			return err
		}
		failures = 0
		if len(events) > 0 && emit(events) != nil {
			return nil
		}
	}
}

type fsUnwatchParams struct {
	WatchID string `json:"watch_id"`
}

// fsUnwatch: box_fs_unwatch {"watch_id"} → {}; an unknown id is a
// BoxValidationError on watch_id.
func (d *Dispatcher) fsUnwatch(ctx context.Context, p fsUnwatchParams) (struct{}, error) {
	if !d.watches.Remove(p.WatchID, tenant.Scope(ctx)) {
		return struct{}{}, boxerr.Validation("watch_id", "no running watch %q", p.WatchID)
	}
	return struct{}{}, nil
}
