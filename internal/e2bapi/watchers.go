package e2bapi

import (
	"context"
	"errors"
	"sync"

	"connectrpc.com/connect"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/filesystem"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// maxWatcherEvents bounds what a polled watcher keeps between two
// GetWatcherEvents; older events are dropped first.
const maxWatcherEvents = 1024

// watcher is a polled watch (CreateWatcher): its events wait for
// GetWatcherEvents.
type watcher struct {
	stop context.CancelFunc
	done chan struct{}

	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	err    error // why the watch ended, once it has
}

func (w *watcher) add(evs []*filesystem.FilesystemEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, evs...)
	if n := len(w.events) - maxWatcherEvents; n > 0 {
		w.events = append(w.events[:0], w.events[n:]...)
	}
}

// take returns the events so far, or the end once they are all taken.
func (w *watcher) take() ([]*filesystem.FilesystemEvent, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.events
	w.events = nil
	if len(evs) == 0 {
		return nil, w.err
	}
	return evs, nil
}

// watch starts a watch of req's directory in ctx's sandbox, admitted in
// the shared budget, handing each poll's events to emit until ctx ends;
// it returns the end (nil when ctx ended or emit failed).
func (f *filesystemService) watch(ctx context.Context, path string, recursive, withEntry bool, started func() error,
	emit func([]*filesystem.FilesystemEvent) error) error {
	depth := 1
	if recursive {
		depth = maxWatchDepth
	}
	w, err := f.h.rt.Files().Watch(ctx, sandboxOf(ctx).logical, path, depth)
	if err != nil {
		return connectError(err)
	}
	defer w.Close()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	id, scope, interval := "e2b-"+randomHex(16), tenant.Scope(ctx), actions.DefaultWatchInterval
	if err := f.h.opts.Watches.Add(id, scope, stop, actions.WatchCost(w.Entries(), interval)); err != nil {
		return connectError(err)
	}
	defer f.h.opts.Watches.Remove(id, scope)
	if err := started(); err != nil {
		return err
	}
	return connectError(f.h.opts.Watches.Run(ctx, id, scope, w, interval, func(events []runtime.FileEvent) error {
		return emit(fileEvents(path, events, withEntry))
	}))
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	sb := sandboxOf(ctx)
	// The watch outlives this call (until RemoveWatcher, the sandbox's end
	// or the server's), in the sandbox's placement.
	wctx, stop := context.WithCancel(context.WithValue(sb.context(context.Background()), sandboxKey{}, sb))
	w := &watcher{stop: stop, done: make(chan struct{})}
	admitted := make(chan error, 1)
	go func() {
		defer close(w.done)
		err := f.watch(wctx, req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(),
			func() error { admitted <- nil; return nil },
			func(evs []*filesystem.FilesystemEvent) error { w.add(evs); return nil })
		if err == nil {
			err = connect.NewError(connect.CodeCanceled, errors.New("the watcher was removed"))
		}
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		admitted <- err
	}()
	if err := <-admitted; err != nil {
		stop()
		return nil, err
	}
	id := sb.addWatcher(w)
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	sb := sandboxOf(ctx)
	w, err := sb.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	evs, err := w.take()
	if err != nil {
		sb.removeWatcher(req.Msg.GetWatcherId())
		return nil, err
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	sb := sandboxOf(ctx)
	if _, err := sb.watcher(req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	sb.removeWatcher(req.Msg.GetWatcherId())
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

func (s *sandbox) addWatcher(w *watcher) string {
	id := "w-" + randomHex(16)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchers == nil {
		s.watchers = map[string]*watcher{}
	}
	s.watchers[id] = w
	return id
}

func (s *sandbox) watcher(id string) (*watcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("watcher "+id+" not found"))
	}
	return w, nil
}

// removeWatcher stops a watcher and waits for its poller to end.
func (s *sandbox) removeWatcher(id string) {
	s.mu.Lock()
	w := s.watchers[id]
	delete(s.watchers, id)
	s.mu.Unlock()
	if w != nil {
		w.stop()
		<-w.done
	}
}

// stopWatchers stops every watcher of s (its record is going).
func (s *sandbox) stopWatchers() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.watchers))
	for id := range s.watchers {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.removeWatcher(id)
	}
}
