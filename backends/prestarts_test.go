package backends

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

type ender struct{ ended atomic.Int32 }

func (e *ender) End() { e.ended.Add(1) }

func TestPrestarts(t *testing.T) {
	var p Prestarts[*ender]
	a, b, c := &ender{}, &ender{}, &ender{}
	p.Put("s1", a)
	p.Put("s1", b) // replaces a, which ends
	p.Put("s2", c)
	if a.ended.Load() != 1 || b.ended.Load() != 0 {
		t.Fatalf("replaced one ended %d times, its successor %d", a.ended.Load(), b.ended.Load())
	}
	if got, ok := p.Take(context.Background(), "s1"); !ok || got != b {
		t.Fatalf("Take: %v %v, want the latest", got, ok)
	}
	if _, ok := p.Take(context.Background(), "s1"); ok {
		t.Fatal("handed out twice")
	}
	if b.ended.Load() != 0 {
		t.Fatal("a taken one is the taker's to end")
	}
	p.Drop("s1") // nothing there: no-op
	p.Put("s1", b)
	p.Drop("s1")
	p.EndAll()
	p.EndAll()
	if b.ended.Load() != 1 || c.ended.Load() != 1 {
		t.Fatalf("dropped one ended %d times, the last one %d (want once each)", b.ended.Load(), c.ended.Load())
	}
	if _, ok := p.Take(context.Background(), "s2"); ok {
		t.Fatal("EndAll left one on offer")
	}
	late := &ender{}
	p.Put("s3", late)
	if late.ended.Load() != 1 {
		t.Fatal("one offered after EndAll was kept")
	}
}

// gate is a start that blocks until released, then returns v or err.
type gate struct {
	release chan struct{}
	started atomic.Int32
	v       *ender
	err     error
}

func newGate(err error) *gate { return &gate{release: make(chan struct{}), v: &ender{}, err: err} }

func (g *gate) start(ctx context.Context) (*ender, error) {
	g.started.Add(1)
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if g.err != nil {
		return nil, g.err
	}
	return g.v, nil
}

// TestPrestartsStarting covers one started in the background: what
// happens to it depends on whether it is taken, dropped, replaced or
// given up while it starts.
func TestPrestartsStarting(t *testing.T) {
	failed := errors.New("engine said no")
	scenarios := []struct {
		name string
		err  error // the start's result
		// while runs while the start is blocked; after runs once it
		// returned. Each reports what the test then checks.
		while func(p *Prestarts[*ender]) (taken chan *ender)
		after func(t *testing.T, p *Prestarts[*ender], g *gate, taken *ender)
	}{
		{name: "a taker waits for it and gets it",
			while: takeAsync,
			after: func(t *testing.T, p *Prestarts[*ender], g *gate, taken *ender) {
				if taken != g.v || g.v.ended.Load() != 0 {
					t.Fatalf("taker got %v (ended %d times), want the started one, unended", taken, g.v.ended.Load())
				}
			}},
		{name: "a taker of one that fails gets none, and the key is free again",
			err:   failed,
			while: takeAsync,
			after: func(t *testing.T, p *Prestarts[*ender], g *gate, taken *ender) {
				if taken != nil {
					t.Fatalf("taker got %v from a failed start", taken)
				}
				wantStartsAgain(t, p)
			}},
		{name: "a failed start not taken frees the key",
			err: failed,
			after: func(t *testing.T, p *Prestarts[*ender], g *gate, taken *ender) {
				waitFor(t, func() bool { _, ok := p.Take(context.Background(), "k"); return !ok })
				wantStartsAgain(t, p)
			}},
		{name: "dropped while starting, it ends when it arrives",
			while: func(p *Prestarts[*ender]) chan *ender { p.Drop("k"); return nil },
			after: func(t *testing.T, p *Prestarts[*ender], g *gate, taken *ender) {
				waitFor(t, func() bool { return g.v.ended.Load() == 1 })
				if _, ok := p.Take(context.Background(), "k"); ok {
					t.Fatal("a dropped one is on offer")
				}
			}},
		{name: "replaced while starting, it ends when it arrives and the new one stays",
			while: func(p *Prestarts[*ender]) chan *ender { p.Put("k", &ender{}); return nil },
			after: func(t *testing.T, p *Prestarts[*ender], g *gate, taken *ender) {
				waitFor(t, func() bool { return g.v.ended.Load() == 1 })
				if v, ok := p.Take(context.Background(), "k"); !ok || v == g.v {
					t.Fatalf("Take: %v %v, want the replacement", v, ok)
				}
			}},
		{name: "a taker that gives up leaves it to end on arrival",
			while: func(p *Prestarts[*ender]) chan *ender {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				defer cancel()
				if v, ok := p.Take(ctx, "k"); ok {
					panic(v)
				}
				return nil
			},
			after: func(t *testing.T, p *Prestarts[*ender], g *gate, taken *ender) {
				waitFor(t, func() bool { return g.v.ended.Load() == 1 })
			}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var p Prestarts[*ender]
			defer p.EndAll()
			g := newGate(sc.err)
			wait := p.Start(context.Background(), "k", g.start)
			again := newGate(nil)
			if waitAgain := p.Start(context.Background(), "k", again.start); waitAgain == nil {
				t.Fatal("no wait for the one on its way")
			}
			var takenc chan *ender
			if sc.while != nil {
				takenc = sc.while(&p)
			}
			close(g.release)
			if err := wait(context.Background()); !errors.Is(err, sc.err) {
				t.Fatalf("wait: %v, want %v", err, sc.err)
			}
			var taken *ender
			if takenc != nil {
				taken = <-takenc
			}
			sc.after(t, &p, g, taken)
			if again.started.Load() != 0 {
				t.Fatal("a second start ran while one was on its way")
			}
		})
	}
}

// TestPrestartsEndAllWhileStarting checks that EndAll waits for a start
// under way (whose ctx the backend cancelled) and refuses new ones.
func TestPrestartsEndAllWhileStarting(t *testing.T) {
	var p Prestarts[*ender]
	ctx, cancel := context.WithCancel(context.Background())
	g := newGate(nil)
	wait := p.Start(ctx, "k", g.start)
	waitFor(t, func() bool { return g.started.Load() == 1 })
	cancel()
	p.EndAll()
	if err := wait(context.Background()); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait after EndAll: %v, want context.Canceled", err)
	}
	later := newGate(nil)
	if err := p.Start(context.Background(), "k", later.start)(context.Background()); !errors.Is(err, errPrestartsClosed) {
		t.Fatalf("Start after EndAll: %v, want %v", err, errPrestartsClosed)
	}
	if later.started.Load() != 0 {
		t.Fatal("a start ran after EndAll")
	}
}

func takeAsync(p *Prestarts[*ender]) chan *ender {
	c := make(chan *ender, 1)
	go func() {
		v, _ := p.Take(context.Background(), "k")
		c <- v
	}()
	// The taker must be waiting before the start returns.
	waitFor(nil, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.m["k"] == nil
	})
	return c
}

func wantStartsAgain(t *testing.T, p *Prestarts[*ender]) {
	t.Helper()
	g := newGate(nil)
	close(g.release)
	if err := p.Start(context.Background(), "k", g.start)(context.Background()); err != nil || g.started.Load() != 1 {
		t.Fatalf("a new start after a failed one: err %v, started %d times", err, g.started.Load())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	for i := 0; i < 500; i++ {
		if cond() {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	if t != nil {
		t.Helper()
		t.Fatal("condition not reached in 1 s")
	}
	panic("condition not reached in 1 s")
}
