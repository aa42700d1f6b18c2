package actions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/boxerr"
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
	// DefaultWatchInterval is how often a watch polls unless told.
	DefaultWatchInterval = time.Second
	minWatchInterval     = 200 * time.Millisecond
	maxWatchInterval     = time.Minute
	// watchFailures: consecutive failed polls (other than the directory
	// or session being gone) that end a watch.
	watchFailures = 5
)

// watchSet is the running watches by id. Each belongs to the namespace
// it was made in (tenant.Scope): another namespace's unwatch finds none.
type watchSet struct {
	mu   sync.Mutex
	stop map[string]watchEntry
}

type watchEntry struct {
	scope string
	stop  context.CancelFunc
}

func (s *watchSet) add(id, scope string, stop context.CancelFunc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.stop) >= MaxWatches {
		return boxerr.CapacityExceeded("max_watches", MaxWatches, "%d directory watches are running (box_fs_unwatch some)", MaxWatches)
	}
	if s.stop == nil {
		s.stop = map[string]watchEntry{}
	}
	s.stop[id] = watchEntry{scope: scope, stop: stop}
	return nil
}

// remove stops and forgets a watch of scope; false when there was none.
func (s *watchSet) remove(id, scope string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.stop[id]
	if ok = ok && w.scope == scope; ok {
		w.stop()
		delete(s.stop, id)
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
	w, err := d.rt.WatchFiles(ctx, p.SessionID, p.Path, p.Depth)
	if err != nil {
		return fsWatchResult{}, err
	}
	buf := make([]byte, 16)
	_, _ = rand.Read(buf)
	id := "w-" + hex.EncodeToString(buf)
	// The watch outlives the request and ends with its connection.
	wctx, stop := context.WithCancel(rpc.ConnContext(ctx))
	scope := tenant.Scope(ctx)
	if err := d.watches.add(id, scope, stop); err != nil {
		stop()
		return fsWatchResult{}, err
	}
	go func() {
		defer d.watches.remove(id, scope)
		d.runWatch(wctx, id, scope, p.SessionID, w, time.Duration(p.IntervalMS)*time.Millisecond)
	}()
	return fsWatchResult{WatchID: id}, nil
}

// runWatch polls until the watch is stopped or ends, notifying changes.
func (d *Dispatcher) runWatch(ctx context.Context, id, scope, sessionID string, w *runtime.FileWatch, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		events, err := w.Poll(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if failures++; failures < watchFailures && !errors.Is(err, boxerr.ErrSessionNotFound) && !errors.Is(err, boxerr.ErrFileNotFound) {
				continue
			}
			// Gone from the set before the host hears of the end, so an
			// unwatch sent after the last notification finds no watch.
			d.watches.remove(id, scope)
			_ = rpc.Notify(ctx, "box_fs_event", fsEvent{WatchID: id, SessionID: sessionID, Events: []runtime.FileEvent{},
				Ended: &fsEnded{Type: runtime.ErrorType(err), Message: err.Error()}})
			return
		}
		failures = 0
		if len(events) == 0 {
			continue
		}
		for i := range events {
			events[i].FileInfo = events[i].FileInfo.Encoded()
		}
		if rpc.Notify(ctx, "box_fs_event", fsEvent{WatchID: id, SessionID: sessionID, Events: events}) != nil {
			return // the connection is gone
		}
	}
}

type fsUnwatchParams struct {
	WatchID string `json:"watch_id"`
}

// fsUnwatch: box_fs_unwatch {"watch_id"} → {}; an unknown id is a
// BoxValidationError on watch_id.
func (d *Dispatcher) fsUnwatch(ctx context.Context, p fsUnwatchParams) (struct{}, error) {
	if !d.watches.remove(p.WatchID, tenant.Scope(ctx)) {
		return struct{}{}, boxerr.Validation("watch_id", "no running watch %q", p.WatchID)
	}
	return struct{}{}, nil
}
