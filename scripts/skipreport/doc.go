// Command skipreport makes skipped tests visible. scripts/test pipes
// `go test -json` through it: it prints what plain `go test` would (the
// package lines, and the output of failed tests only) and appends each
// skipped test, with the reason it gave, to a file. At the end
// `skipreport -summary` lists every skip of the whole run, and with -ci
// fails it for any skip that .ci/skips-allowed does not name with a
// reason: a skip in CI is a test that did not run, and must be a decision.
package main
