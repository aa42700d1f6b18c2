// Package backendtest holds what the integration tests of every backend
// share: the escape tests (one table, run against each backend and
// runtime of the test matrix), which run a static probe program,
// test/fixtures/escape, inside a sandbox. Only tests import it.
package backendtest
