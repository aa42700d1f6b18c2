package main

import (
	"testing"
	"time"
)

func TestPingLatencyGoal(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	row := func(p50 time.Duration) Row {
		if p50 == 0 {
			return Row{Boxrt: newMeasure("not run")}
		}
		m := newMeasure("peer")
		m.add(RunStats{N: 1, P50: p50})
		return Row{Boxrt: m}
	}
	tests := []struct {
		name              string
		boxrt, echo, link time.Duration
		wantMet, wantAt   bool
	}{
		{"no slower than the echo peer", us(12), us(12), us(13), true, false},
		{"slower than the echo peer, no slower than the linked one", us(13), us(12), us(13), false, true},
		{"slower than the linked peer too", us(14), us(12), us(13), false, false},
		{"no linked peer measured", us(13), us(12), 0, false, false},
		{"over the absolute bound", us(45), us(44), us(50), false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := row(tc.boxrt)
			r.Base = row(tc.echo).Boxrt
			none := Row{}
			g := pingLatencyGoal(r, none, none, row(tc.link), none, none)
			if g.Met == nil || *g.Met != tc.wantMet || g.AtFloor != tc.wantAt {
				t.Errorf("met %v, at floor %v, want %v, %v (%s)", g.Met != nil && *g.Met, g.AtFloor, tc.wantMet, tc.wantAt, g.Measured)
			}
		})
	}
}
