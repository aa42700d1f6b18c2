package backends

import "sync"

// Prestarts holds what a backend started ahead of its sandboxes' next exec
// (see ExecPrestarter), at most one per sandbox key. Each is handed out
// once (Take), and ended when it is replaced, dropped or the backend
// closes (EndAll).
type Prestarts[T interface{ End() }] struct {
	mu sync.Mutex
	m  map[string]T
}

// Put offers v for key, ending the one it replaces.
func (p *Prestarts[T]) Put(key string, v T) {
	p.mu.Lock()
	if p.m == nil {
		p.m = map[string]T{}
	}
	old, had := p.m[key]
	p.m[key] = v
	p.mu.Unlock()
	if had {
		old.End()
	}
}

// Take removes key's and returns it.
func (p *Prestarts[T]) Take(key string) (v T, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok = p.m[key]
	delete(p.m, key)
	return v, ok
}

// Drop ends key's, if any.
func (p *Prestarts[T]) Drop(key string) {
	if v, ok := p.Take(key); ok {
		v.End()
	}
}

// EndAll ends every one.
func (p *Prestarts[T]) EndAll() {
	p.mu.Lock()
	all := p.m
	p.m = nil
	p.mu.Unlock()
	for _, v := range all {
		v.End()
	}
}
