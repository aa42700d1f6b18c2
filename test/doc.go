// Package test holds black-box tests: they build the boxrt binary, spawn it
// the way a host does (serve --stdio, or serve --listen and /rpc/ws) and
// speak the wire protocol to it. The bench harness lives in test/bench.
package test
