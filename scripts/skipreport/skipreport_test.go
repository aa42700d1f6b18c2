package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRun is `go test -json` of testdata/fake, through filter.
func fakeRun(t *testing.T) (shown string, skips []Skip) {
	t.Helper()
	cmd := exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = filepath.Join("testdata", "fake")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	raw, err := cmd.Output()
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("go test of the fake package should fail (TestFails): err %v, output:\n%s", err, raw)
	}
	var out bytes.Buffer
	skips, err = filter(bytes.NewReader(raw), &out, "runc")
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), skips
}

func TestFilterShowsFailuresAndRecordsSkips(t *testing.T) {
	shown, skips := fakeRun(t)
	for _, want := range []string{"--- FAIL: TestFails", "the failure shown", "FAIL\tfake"} {
		if !strings.Contains(shown, want) {
			t.Errorf("output lacks %q:\n%s", want, shown)
		}
	}
	for _, hidden := range []string{"passing output", "=== RUN", "--- SKIP", "no widget"} {
		if strings.Contains(shown, hidden) {
			t.Errorf("output shows %q, plain go test does not:\n%s", hidden, shown)
		}
	}
	got := map[string]string{}
	for _, s := range skips {
		got[s.Name()] = s.Reason
		if s.Phase != "runc" {
			t.Errorf("%s: phase %q", s.Name(), s.Phase)
		}
	}
	want := map[string]string{"fake.TestSkipsTop": "no widget here", "fake.TestParent/child": "needs root"}
	if len(got) != len(want) {
		t.Errorf("skips %v, want %v", got, want)
	}
	for name, r := range want {
		if !strings.Contains(got[name], r) {
			t.Errorf("skip %s: reason %q, want it to contain %q (all: %v)", name, got[name], r, got)
		}
	}
}

func TestReport(t *testing.T) {
	_, skips := fakeRun(t)
	rules, err := parseAllow("allow", "# header comment\n\nfake\\.TestParent/.*   # children need root\nfake.TestSkipsTop @podman # only there\n")
	if err != nil {
		t.Fatal(err)
	}
	var w bytes.Buffer
	if bad := report(&w, skips, rules, "allow", false); bad != 0 {
		t.Errorf("outside CI nothing fails; got %d\n%s", bad, w.String())
	}
	for _, want := range []string{"2 skipped tests", "SKIP fake.TestSkipsTop [runc]: ", "no widget here", "(allowed: children need root)"} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, w.String())
		}
	}
	w.Reset()
	// In CI the top-level skip is not allowed: its rule is for another phase.
	if bad := report(&w, skips, rules, "allow", true); bad != 1 || !strings.Contains(w.String(), "no widget here (NOT ALLOWED in CI)") {
		t.Errorf("CI: %d not allowed, want 1:\n%s", bad, w.String())
	}
}

func TestAllowListNeedsReasons(t *testing.T) {
	for _, text := range []string{"fake.TestX\n", "fake.TestX   #   \n", "fake.TestX extra # why\n", "fake.(  # bad regexp\n"} {
		if _, err := parseAllow("allow", text); err == nil {
			t.Errorf("%q: accepted", text)
		}
	}
	rules, err := parseAllow("allow", "fake.TestX # why\n")
	if err != nil || len(rules) != 1 {
		t.Fatalf("rules %v err %v", rules, err)
	}
	if rules[0].allows(Skip{Package: "fake", Test: "TestXY"}) {
		t.Error("a pattern matches a name only as a whole")
	}
}
