package docker_test

import (
	"testing"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestHostileArchives restores crafted archives through the engine: each
// hostile one is refused before the engine sees it (nothing lands in a
// mount, nor through a symlink into one), setuid bits are cleared, and no
// host directory changes.
func TestHostileArchives(t *testing.T) {
	backendtest.HostileArchives(t, conformanceEnv(t), backendtest.HostileOptions{Rootfs: true, Mounts: true})
}
