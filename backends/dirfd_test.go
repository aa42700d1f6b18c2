package backends_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// A directory swapped for a symlink after the allow-list check must not
// make EnsureDir create directories wherever the link points (as root,
// that was a root-owned directory anywhere on the host).
func TestEnsureDirRefusesSymlinks(t *testing.T) {
	tests := []struct {
		name   string
		layout func(root, victim string) string // returns the path to ensure
		ok     bool
	}{
		{"missing chain is created", func(root, _ string) string { return filepath.Join(root, "a", "b", "c") }, true},
		{"existing directory", func(root, _ string) string { return root }, true},
		{"parent swapped for a symlink", func(root, victim string) string {
			must(t, os.Symlink(victim, filepath.Join(root, "swapped")))
			return filepath.Join(root, "swapped", "planted")
		}, false},
		{"last component is a symlink", func(root, victim string) string {
			must(t, os.Symlink(victim, filepath.Join(root, "link")))
			return filepath.Join(root, "link")
		}, false},
		{"a file in the path", func(root, _ string) string {
			must(t, os.WriteFile(filepath.Join(root, "file"), nil, 0o644))
			return filepath.Join(root, "file", "x")
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, victim := t.TempDir(), t.TempDir()
			err := backends.EnsureDir(tc.layout(root, victim))
			if tc.ok {
				if err != nil {
					t.Fatalf("EnsureDir: %v", err)
				}
				return
			}
			if !errors.Is(err, boxerr.ErrValidation) {
				t.Fatalf("want a BoxValidationError, got %v", err)
			}
			if entries, _ := os.ReadDir(victim); len(entries) != 0 {
				t.Fatalf("EnsureDir created %s in the symlink's target", entries[0].Name())
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
