package backends

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/runtime/boxerr"
)

func TestResolveHostPath(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "out")))
	require.NoError(t, os.Symlink("/etc", filepath.Join(root, "etc")))
	tests := []struct {
		name, path string
		ok         bool
	}{
		{"root itself", root, true},
		{"not yet existing child", filepath.Join(root, "new", "dir"), true},
		{"symlink out", filepath.Join(root, "out"), false},
		{"symlink to /etc", filepath.Join(root, "etc"), false},
		{"missing child of a symlink out", filepath.Join(root, "out", "x"), false},
		{"dot-dot", root + "/../" + filepath.Base(outside), false},
		{"slash", "/", false},
		{"relative", "rel", false},
		{"docker socket", "/var/run/docker.sock", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ResolveHostPath("host_path", tc.path, []string{root})
			if tc.ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, boxerr.ErrValidation)
			}
		})
	}
	_, err := ResolveHostPath("host_path", root, nil)
	assert.ErrorIs(t, err, boxerr.ErrValidation, "no allow-list means no host paths")
}
