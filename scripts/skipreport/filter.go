package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// Skip is a test that skipped, and what it said.
type Skip struct {
	Phase   string `json:"phase,omitempty"`
	Package string `json:"package"`
	Test    string `json:"test"`
	Reason  string `json:"reason"`
}

// Name is how the allow-list and the summary name the test: the package
// path below the module, a dot, the test's full name.
func (s Skip) Name() string {
	pkg := strings.TrimPrefix(s.Package, module+"/")
	if s.Package == module {
		pkg = "."
	}
	return pkg + "." + s.Test
}

const module = "github.com/boxrt/boxrt"

// filterFile is filter appending the skips to the file at path.
func filterFile(in io.Reader, out io.Writer, path, phase string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	skips, ferr := filter(in, out, phase)
	enc := json.NewEncoder(f)
	for _, s := range skips {
		if err := enc.Encode(s); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return ferr
}

// filter prints what plain go test prints of a -json stream: build
// output, package lines, and the output of each failed test (without the
// === markers -json implies); it returns the skipped tests.
func filter(in io.Reader, out io.Writer, phase string) ([]Skip, error) {
	var skips []Skip
	pending := map[[2]string][]string{} // output of tests still running
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not test2json: go's own message
			continue
		}
		key := [2]string{e.Package, e.Test}
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Action == "output" && e.Test == "":
			if strings.TrimSpace(e.Output) != "PASS" {
				fmt.Fprint(out, e.Output)
			}
		case e.Action == "output":
			pending[key] = append(pending[key], e.Output)
		case e.Test != "" && e.Action == "fail":
			fmt.Fprint(out, strings.Join(shown(pending[key]), ""))
			delete(pending, key)
		case e.Test != "" && e.Action == "skip":
			skips = append(skips, Skip{Phase: phase, Package: e.Package, Test: e.Test, Reason: reason(pending[key])})
			delete(pending, key)
		case e.Test != "" && e.Action == "pass":
			delete(pending, key)
		case e.Test == "" && e.Action == "fail":
			// A package that died (timeout, panic) leaves tests that never
			// ended: their output is the story.
			for k, lines := range pending {
				if k[0] == e.Package {
					fmt.Fprint(out, strings.Join(shown(lines), ""))
					delete(pending, k)
				}
			}
		}
	}
	return skips, sc.Err()
}

// shown drops the === RUN/PAUSE/CONT/NAME markers -json turns on.
func shown(lines []string) []string {
	var keep []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "=== ") {
			keep = append(keep, l)
		}
	}
	return keep
}

// reason is what a skipped test logged, without the markers and its
// --- SKIP line, on one line.
func reason(lines []string) string {
	var parts []string
	for _, l := range shown(lines) {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "--- SKIP") {
			parts = append(parts, l)
		}
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " | ")
}

// readSkips reads what filterFile appended.
func readSkips(path string) ([]Skip, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var skips []Skip
	dec := json.NewDecoder(strings.NewReader(string(b)))
	for dec.More() {
		var s Skip
		if err := dec.Decode(&s); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		skips = append(skips, s)
	}
	return skips, nil
}
