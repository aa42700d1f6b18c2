package backends

import (
	"context"
	"errors"
	"sync"
)

var errPrestartsClosed = errors.New("the backend is closing")

// Prestarts holds what a backend started ahead of its sandboxes' next exec
// (see ExecPrestarter), at most one per sandbox key, ready or still
// starting. Each is handed out once (Take), and ended when it is replaced,
// dropped or the backend closes (EndAll); one still starting then is
// ended when it arrives.
type Prestarts[T interface{ End() }] struct {
	mu       sync.Mutex
	m        map[string]*prestart[T]
	closed   bool
	starting sync.WaitGroup
}

// prestart is one key's: arrived is set, and ready closed, when its start
// returned (v, or err); gone marks one that nobody will take (dropped,
// replaced, or given up by its taker) while it was starting.
type prestart[T any] struct {
	ready   chan struct{}
	arrived bool
	gone    bool
	v       T
	err     error
}

// Put offers v for key, ending the one it replaces (and v itself once
// EndAll has run).
func (p *Prestarts[T]) Put(key string, v T) {
	s := &prestart[T]{ready: make(chan struct{}), arrived: true, v: v}
	close(s.ready)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		v.End()
		return
	}
	if p.m == nil {
		p.m = map[string]*prestart[T]{}
	}
	old := p.m[key]
	p.m[key] = s
	p.mu.Unlock()
	p.abandon(old)
}

// Start runs start in the background for key's next one, unless key has
// one (ready or starting) or EndAll has run. A start that fails leaves
// key without one: the next exec runs as usual. wait waits for key's one
// (this start's or the one that was there) until ctx ends: nil once it
// is ready, or why it is not.
func (p *Prestarts[T]) Start(ctx context.Context, key string, start func(context.Context) (T, error)) (wait func(context.Context) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return func(context.Context) error { return errPrestartsClosed }
	}
	if s := p.m[key]; s != nil {
		return s.wait
	}
	if p.m == nil {
		p.m = map[string]*prestart[T]{}
	}
	s := &prestart[T]{ready: make(chan struct{})}
	p.m[key] = s
	p.starting.Add(1)
	go func() {
		defer p.starting.Done()
		v, err := start(ctx)
		p.mu.Lock()
		s.arrived = true
		s.v, s.err = v, err
		gone := s.gone
		if err != nil && p.m[key] == s {
			delete(p.m, key)
		}
		close(s.ready)
		p.mu.Unlock()
		if err == nil && gone {
			v.End()
		}
	}()
	return s.wait
}

func (s *prestart[T]) wait(ctx context.Context) error {
	select {
	case <-s.ready:
		return s.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Take removes key's and returns it, waiting for one still starting (it
// had a head start on anything the caller could start now) until ctx
// ends.
func (p *Prestarts[T]) Take(ctx context.Context, key string) (v T, ok bool) {
	p.mu.Lock()
	s := p.m[key]
	delete(p.m, key)
	p.mu.Unlock()
	if s == nil {
		return v, false
	}
	select {
	case <-s.ready:
		return s.v, s.err == nil
	case <-ctx.Done():
		p.abandon(s)
		return v, false
	}
}

// Drop ends key's, if any.
func (p *Prestarts[T]) Drop(key string) {
	p.mu.Lock()
	s := p.m[key]
	delete(p.m, key)
	p.mu.Unlock()
	p.abandon(s)
}

// EndAll ends every one, waits for those still starting (their start's
// ctx should be done by now), and ends whatever is offered later.
func (p *Prestarts[T]) EndAll() {
	p.mu.Lock()
	all := p.m
	p.m = nil
	p.closed = true
	p.mu.Unlock()
	for _, s := range all {
		p.abandon(s)
	}
	p.starting.Wait()
}

// abandon ends s (removed from the map by the caller) now if it has
// arrived, or when it does.
func (p *Prestarts[T]) abandon(s *prestart[T]) {
	if s == nil {
		return
	}
	p.mu.Lock()
	end := s.arrived && s.err == nil
	s.gone = !s.arrived
	p.mu.Unlock()
	if end {
		s.v.End()
	}
}
