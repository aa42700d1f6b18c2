// Package test holds black-box tests: they build the boxrt binary, spawn it
// the way a host does (serve --stdio, or serve --listen and /rpc/ws) and
// speak the wire protocol to it. The walks of the documentation run its
// commands as written, extracted from the text: README.md and the top-level
// --help's quick start (firsthour_test.go), every subcommand's --help
// examples (help_examples_test.go). The bench harness lives in test/bench.
package test
