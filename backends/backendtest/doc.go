// Package backendtest holds what the integration tests of every backend
// share: the escape tests (one table, run against each backend and
// runtime of the test matrix) and the static probe program they run
// inside a sandbox (escapeprobe). Only tests import it.
package backendtest
