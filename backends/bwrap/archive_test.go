package bwrap

import (
	"testing"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestHostileArchives restores crafted archives (../ and absolute names, a
// symlink then a file through it, hard links out, devices, FIFOs, setuid
// files) on the host side, as root: each is refused or neutralised and no
// host directory changes.
func TestHostileArchives(t *testing.T) {
	backendtest.HostileArchives(t, conformanceEnv(t), backendtest.HostileOptions{Mounts: true})
}
