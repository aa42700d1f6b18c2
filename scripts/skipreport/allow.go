package main

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// rule is one line of the allow-list: a regular expression the whole of
// a skip's Name must match, an optional phase it is limited to, and why.
type rule struct {
	pattern *regexp.Regexp
	phase   string
	why     string
}

func (r rule) allows(s Skip) bool {
	return (r.phase == "" || r.phase == s.Phase) && r.pattern.MatchString(s.Name())
}

// readAllowFile parses the allow-list at path; a missing file allows
// nothing.
func readAllowFile(path string) ([]rule, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parseAllow(path, string(b))
}

// parseAllow reads lines "PATTERN [@PHASE] # why"; blank lines and lines
// that are only a comment are ignored. A rule without its reason is an
// error: the list is the record of why a test may not run.
func parseAllow(name, text string) ([]rule, error) {
	var rules []rule
	for i, line := range strings.Split(text, "\n") {
		spec, why, _ := strings.Cut(line, "#")
		fields := strings.Fields(spec)
		if len(fields) == 0 {
			continue
		}
		why = strings.TrimSpace(why)
		if why == "" {
			return nil, fmt.Errorf("%s:%d: %q has no \"# reason\": say why this test may skip", name, i+1, strings.TrimSpace(line))
		}
		if len(fields) > 2 || (len(fields) == 2 && !strings.HasPrefix(fields[1], "@")) {
			return nil, fmt.Errorf("%s:%d: want \"PATTERN [@PHASE] # reason\", got %q", name, i+1, strings.TrimSpace(line))
		}
		re, err := regexp.Compile("^(?:" + fields[0] + ")$")
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", name, i+1, err)
		}
		r := rule{pattern: re, why: why}
		if len(fields) == 2 {
			r.phase = strings.TrimPrefix(fields[1], "@")
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// report prints the number of skips and each one with its reason; with
// ci it marks those no rule allows and returns how many there are.
func report(w io.Writer, skips []Skip, rules []rule, allowName string, ci bool) int {
	fmt.Fprintf(w, "%d skipped tests\n", len(skips))
	bad := 0
	for _, s := range skips {
		phase := ""
		if s.Phase != "" {
			phase = " [" + s.Phase + "]"
		}
		verdict := ""
		if why, ok := allowed(s, rules); ok {
			verdict = " (allowed: " + why + ")"
		} else if ci {
			verdict = " (NOT ALLOWED in CI)"
			bad++
		}
		fmt.Fprintf(w, "  SKIP %s%s: %s%s\n", s.Name(), phase, s.Reason, verdict)
	}
	if bad > 0 {
		fmt.Fprintf(w, "%d skips are not on %s: make the test run, or add it there with a # reason\n", bad, allowName)
	}
	return bad
}

func allowed(s Skip, rules []rule) (string, bool) {
	for _, r := range rules {
		if r.allows(s) {
			return r.why, true
		}
	}
	return "", false
}
