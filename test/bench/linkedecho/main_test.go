package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksWhatBoxrtLinks keeps the linked echo peer honest: every package
// the boxrt binary links, this binary links too, so its row measures the
// boxrt binary's weight and not a lighter one's.
func TestLinksWhatBoxrtLinks(t *testing.T) {
	const boxrt = "github.com/boxrt/boxrt"
	deps := func(pkg string) map[string]bool {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		set := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			set[p] = true
		}
		return set
	}
	linked := deps(boxrt + "/test/bench/linkedecho")
	for p := range deps(boxrt) {
		if p != boxrt && !linked[p] {
			t.Errorf("boxrt links %s and linkedecho does not: import it in linkedecho/main.go", p)
		}
	}
}
