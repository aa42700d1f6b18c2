package docker_test

import (
	"testing"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestFiles runs the file API tests every backend shares, in the
// container's own view of its files.
func TestFiles(t *testing.T) {
	backendtest.Files(t, conformanceEnv(t))
}
