// Package agenttest gives tests a static boxrt binary to run as the
// session agent inside a sandbox.
package agenttest

import "testing"

// Binary builds (once per test process, cached under os.TempDir by
// content) a static boxrt binary (CGO_ENABLED=0 go build of the module
// root) and returns its path; tests that need an agent inside a sandbox
// mount it. A failed build fails t with the build's output.
func Binary(t testing.TB) string {
	t.Helper()
	t.Fatal("agenttest.Binary: not implemented yet")
	return ""
}
