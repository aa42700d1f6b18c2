package backends

import "testing"

type ender struct{ ended int }

func (e *ender) End() { e.ended++ }

func TestPrestarts(t *testing.T) {
	var p Prestarts[*ender]
	a, b, c := &ender{}, &ender{}, &ender{}
	p.Put("s1", a)
	p.Put("s1", b) // replaces a, which ends
	p.Put("s2", c)
	if a.ended != 1 || b.ended != 0 {
		t.Fatalf("replaced one ended %d times, its successor %d", a.ended, b.ended)
	}
	if got, ok := p.Take("s1"); !ok || got != b {
		t.Fatalf("Take: %v %v, want the latest", got, ok)
	}
	if _, ok := p.Take("s1"); ok {
		t.Fatal("handed out twice")
	}
	if b.ended != 0 {
		t.Fatal("a taken one is the taker's to end")
	}
	p.Drop("s1") // nothing there: no-op
	p.Put("s1", b)
	p.Drop("s1")
	p.EndAll()
	p.EndAll()
	if b.ended != 1 || c.ended != 1 {
		t.Fatalf("dropped one ended %d times, the last one %d (want once each)", b.ended, c.ended)
	}
	if _, ok := p.Take("s2"); ok {
		t.Fatal("EndAll left one on offer")
	}
}
