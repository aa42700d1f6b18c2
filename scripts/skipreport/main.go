package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	skips := flag.String("skips", "", "file the skipped tests are appended to (filter mode) or read from (-summary)")
	phase := flag.String("phase", "", "label of this go test run in the summary (e.g. the docker runtime)")
	summary := flag.Bool("summary", false, "print the skips recorded in -skips instead of filtering go test -json")
	allow := flag.String("allow", ".ci/skips-allowed", "allow-list: a test pattern (and optional @phase) per line, each with a # reason")
	ci := flag.Bool("ci", false, "fail when a skip is not on the allow-list")
	flag.Parse()
	if *skips == "" {
		fail(2, "-skips is required")
	}
	if !*summary {
		if err := filterFile(os.Stdin, os.Stdout, *skips, *phase); err != nil {
			fail(1, err.Error())
		}
		return
	}
	rules, err := readAllowFile(*allow)
	if err != nil {
		fail(2, err.Error())
	}
	recorded, err := readSkips(*skips)
	if err != nil {
		fail(2, err.Error())
	}
	if bad := report(os.Stderr, recorded, rules, *allow, *ci); bad > 0 {
		os.Exit(1)
	}
}

func fail(code int, msg string) {
	fmt.Fprintln(os.Stderr, "skipreport: "+msg)
	os.Exit(code)
}
