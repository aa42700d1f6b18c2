package keyed

import (
	"sync"
	"testing"
)

// TestLocks: holders of one key exclude each other, readers share, and the
// table forgets keys nobody holds.
func TestLocks(t *testing.T) {
	tests := []struct {
		name string
		run  func(k *Locks)
	}{
		{"one key, many writers", func(k *Locks) {
			var wg sync.WaitGroup
			n := 0
			for range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer k.Lock("a")()
					n++
				}()
			}
			wg.Wait()
			if n != 50 {
				t.Errorf("n = %d, want 50", n)
			}
		}},
		{"overlapping sets in any order", func(k *Locks) {
			var wg sync.WaitGroup
			for i := range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if i%2 == 0 {
						k.Lock("a", "b", "a")()
					} else {
						k.Lock("b", "a")()
					}
				}()
			}
			wg.Wait()
		}},
		{"readers share", func(k *Locks) {
			r1 := k.RLock("a")
			r2 := k.RLock("a")
			r1()
			r2()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var k Locks
			tc.run(&k)
			if len(k.locks) != 0 {
				t.Errorf("%d keys left in the table", len(k.locks))
			}
		})
	}
}
