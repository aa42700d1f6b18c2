package skills

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStartRemovesLeftovers: a boxrt killed with -9 left its private temp
// directory and an install's staging directory behind, forever. Opening the
// store removes them, but not what a live store still holds.
func TestStartRemovesLeftovers(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "skills")
	tmp := filepath.Join(base, "tmp")

	// A live store sharing the directories, mid-install.
	live := New(func() string { return root }, nil, WithTempDir(tmp))
	t.Cleanup(func() { _ = live.Close() })
	livePriv, err := live.privateDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := live.Root(bg); err != nil {
		t.Fatal(err)
	}
	liveStaging, err := os.MkdirTemp(root, stagingPrefix)
	if err != nil {
		t.Fatal(err)
	}
	stagingLock, err := lockDir(liveStaging)
	if err != nil {
		t.Fatal(err)
	}
	defer stagingLock.Close()

	plant := func(parts ...string) string {
		p := filepath.Join(parts...)
		if err := os.MkdirAll(filepath.Join(p, "pkg"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "pkg", "SKILL.md"), []byte("---\nname: x\n---\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.MkdirAll(filepath.Join(root, "kept"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		gone bool
	}{
		{"dead private temp dir", plant(tmp, privatePrefix+"dead1"), true},
		{"dead staging dir", plant(root, stagingPrefix+"dead2"), true},
		{"live private temp dir", livePriv, false},
		{"live staging dir", liveStaging, false},
		{"a skill package", filepath.Join(root, "kept"), false},
		{"an unrelated temp dir", plant(tmp, "other-tool-1"), false},
	}

	s := New(func() string { return root }, nil, WithTempDir(tmp))
	t.Cleanup(func() { _ = s.Close() })

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := os.Stat(tc.path)
			if gone := os.IsNotExist(err); gone != tc.gone {
				t.Fatalf("%s: gone=%v, want %v (stat: %v)", tc.path, gone, tc.gone, err)
			}
		})
	}
}
