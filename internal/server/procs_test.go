package server

import "testing"

func TestProcsFor(t *testing.T) {
	tests := []struct {
		name    string
		current int
		env     string
		want    int
	}{
		{name: "one CPU: a second P", current: 1, want: minProcs},
		{name: "two CPUs: left alone", current: 2, want: 0},
		{name: "many CPUs: left alone", current: 16, want: 0},
		{name: "operator set one: it stands", current: 1, env: "1", want: 0},
		{name: "operator set a value the runtime refused: left alone", current: 1, env: "bogus", want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := procsFor(tt.current, tt.env); got != tt.want {
				t.Fatalf("procsFor(%d, %q) = %d, want %d", tt.current, tt.env, got, tt.want)
			}
		})
	}
}
