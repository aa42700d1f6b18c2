package backends

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
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
	assert.ErrorContains(t, err, "--config file, or with box_init", "the refusal says where to configure the roots")
}

func TestCheckMountPath(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"/workspace", "/workspace", true},
		{"/a/b/../c/", "/a/c", true},
		{"relative", "", false},
		{"/", "", false},
		{"/x/..", "", false},
		{"/proc", "", false},
		{"/proc/self", "", false},
		{"/dev/shm", "", false},
		{"/devices", "/devices", true},
		{"/sys", "", false},
		{"/sys/fs/cgroup", "", false},
		{"/system", "/system", true},
		{"/a\x00b", "", false},
	}
	for _, tc := range cases {
		got, err := CheckMountPath("f", tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("CheckMountPath(%q) = %q, %v; want %q ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, boxerr.ErrValidation) {
			t.Errorf("CheckMountPath(%q) error is not a validation error: %v", tc.in, err)
		}
	}
}
