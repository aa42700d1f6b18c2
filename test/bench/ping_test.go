package main

import (
	"testing"
	"time"
)

func TestPingLatencyGoal(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	measure := func(p50 time.Duration) *Measure {
		m := newMeasure("peer")
		if p50 > 0 {
			m.add(RunStats{N: 1, P50: p50})
		}
		return m
	}
	tests := []struct {
		name        string
		boxrt, echo time.Duration
		want        *bool
	}{
		{"as fast as the echo peer", us(12), us(12), boolp(true)},
		{"at the guard's bound", us(12), us(10), boolp(true)},
		{"past the guard's bound", us(13), us(10), boolp(false)},
		{"boxrt not measured", 0, us(10), nil},
		{"echo peer not measured", us(10), 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := pingLatencyGoal(Row{Boxrt: measure(tc.boxrt), Base: measure(tc.echo)})
			switch {
			case tc.want == nil && g.Met != nil:
				t.Errorf("met %v, want not measured (%s)", *g.Met, g.Measured)
			case tc.want != nil && (g.Met == nil || *g.Met != *tc.want):
				t.Errorf("met %v, want %v (%s)", g.Met, *tc.want, g.Measured)
			}
		})
	}
}
