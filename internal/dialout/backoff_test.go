package dialout

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoffDoublesToTheCap(t *testing.T) {
	s := time.Second
	for failures, want := range []time.Duration{0, s, 2 * s, 4 * s, 8 * s, 16 * s, 30 * s, 30 * s} {
		if got := BackoffBase(failures, s, 30*s); got != want {
			t.Errorf("BackoffBase(%d) = %v, want %v", failures, got, want)
		}
	}
	if got := BackoffBase(500, s, 1<<62); got != 1<<62 {
		t.Errorf("no overflow near the int64 limit: got %v", got)
	}
}

func TestBackoffJitterStaysInItsBand(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for failures := 1; failures <= 8; failures++ {
		base := BackoffBase(failures, time.Second, 30*time.Second)
		lo, hi := time.Duration(float64(base)*0.8), time.Duration(float64(base)*1.2)
		seenLow, seenHigh := false, false
		for range 2000 {
			d := Backoff(failures, time.Second, 30*time.Second, 0.2, 2*r.Float64()-1)
			if d < lo || d >= hi {
				t.Fatalf("failures=%d: %v outside [%v, %v)", failures, d, lo, hi)
			}
			seenLow = seenLow || d < base*9/10
			seenHigh = seenHigh || d > base*11/10
		}
		if !seenLow || !seenHigh {
			t.Errorf("failures=%d: the jitter does not spread the waits", failures)
		}
	}
	if got := Backoff(2, time.Second, time.Minute, 0, -1); got != 2*time.Second {
		t.Errorf("jitter 0 is exact: got %v", got)
	}
}
