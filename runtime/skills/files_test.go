package skills

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// fileFixture is a skill "demo" with a few files, an outside directory and
// symlinks leading in and out.
func fileFixture(t *testing.T) (*Store, string, string) {
	t.Helper()
	s, root := testStore(t)
	mustCreate(t, s, "demo", "body")
	pkg := filepath.Join(root, "demo")
	writeFile(t, filepath.Join(pkg, "README.md"), "readme")
	writeFile(t, filepath.Join(pkg, "docs", "guide.md"), "guide ünïcode")
	writeFile(t, filepath.Join(pkg, ".hidden"), "h")
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "secret.txt"), "secret")
	must(t, os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(pkg, "leak.txt")))
	must(t, os.Symlink(outside, filepath.Join(pkg, "outdir")))
	must(t, os.Symlink("../README.md", filepath.Join(pkg, "docs", "readme-link.md")))
	must(t, os.Symlink("/nonexistent/target", filepath.Join(pkg, "dangling")))
	return s, pkg, outside
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestReadFile(t *testing.T) {
	s, pkg, _ := fileFixture(t)
	got, err := s.ReadFile(bg, "demo", " docs/../docs/guide.md ")
	if err != nil || got.Content != "guide ünïcode" || got.Path != "docs/guide.md" || got.Skill.Name != "demo" {
		t.Fatalf("read: %+v %v", got, err)
	}
	// A symlink that stays inside the package is followed.
	if got, err := s.ReadFile(bg, "demo", "docs/readme-link.md"); err != nil || got.Content != "readme" {
		t.Fatalf("inside symlink: %+v %v", got, err)
	}
	writeFile(t, filepath.Join(pkg, "big.txt"), strings.Repeat("x", MaxTextBytes+1))
	writeFile(t, filepath.Join(pkg, "max.txt"), strings.Repeat("x", MaxTextBytes))
	writeFile(t, filepath.Join(pkg, "latin1.txt"), "caf\xe9")
	if _, err := s.ReadFile(bg, "demo", "max.txt"); err != nil {
		t.Fatalf("exactly 1 MiB: %v", err)
	}
	for _, tc := range []struct{ path, want string }{
		{"../escape.txt", "must stay within the skill package root"},
		{"../../etc/passwd", "must stay within the skill package root"},
		{"..", "must stay within the skill package root"},
		{"docs/../../x", "must stay within the skill package root"},
		{"/etc/passwd", "must be relative"},
		{"a\x00b", "NUL"},
		{"leak.txt", "must stay within the skill package root"},
		{"outdir/secret.txt", "must stay within the skill package root"},
		{"dangling", "Skill file not found"},
		{"missing.txt", "Skill file not found: missing.txt"},
		{"docs", "Skill file not found: docs"},
		{".", "Skill file not found"},
		{"big.txt", "exceeds the 1048576-byte limit"},
		{"latin1.txt", "is not valid UTF-8 text"},
	} {
		_, err := s.ReadFile(bg, "demo", tc.path)
		wantValidation(t, err, tc.want)
	}
	_, err = s.ReadFile(bg, "nope", "README.md")
	wantValidation(t, err, `Skill "nope" not found`)
}

func TestWriteFile(t *testing.T) {
	s, pkg, outside := fileFixture(t)
	res, err := s.WriteFile(bg, "demo", "new/dir/file.txt", "héllo")
	if err != nil || res.BytesWritten != len("héllo") || res.Path != "new/dir/file.txt" {
		t.Fatalf("write: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(pkg, "new", "dir", "file.txt")); string(b) != "héllo" {
		t.Fatalf("content %q", b)
	}
	// Overwrite keeps the mode; an inside symlink is written through.
	must(t, os.Chmod(filepath.Join(pkg, "README.md"), 0o755))
	if _, err := s.WriteFile(bg, "demo", "docs/readme-link.md", "via link"); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Lstat(filepath.Join(pkg, "README.md"))
	if b, _ := os.ReadFile(filepath.Join(pkg, "README.md")); string(b) != "via link" || fi.Mode().Perm() != 0o755 {
		t.Fatalf("through link: %q %v", b, fi.Mode())
	}
	if fi, _ := os.Lstat(filepath.Join(pkg, "docs", "readme-link.md")); fi.Mode()&os.ModeSymlink == 0 {
		t.Fatal("symlink replaced")
	}
	if _, err := s.WriteFile(bg, "demo", "max.txt", strings.Repeat("x", MaxTextBytes)); err != nil {
		t.Fatalf("exactly 1 MiB: %v", err)
	}
	for _, tc := range []struct{ path, content, want string }{
		{"../escape.txt", "x", "must stay within the skill package root"},
		{"/tmp/abs.txt", "x", "must be relative"},
		{"leak.txt", "x", "must stay within the skill package root"},
		{"outdir/new.txt", "x", "must stay within the skill package root"},
		{"outdir/deeper/new.txt", "x", "must stay within the skill package root"},
		{"dangling", "x", "dangling symlink"},
		{".", "x", "must name a file"},
		{"docs", "x", "not a regular file"},
		{"README.md/x", "x", "not a directory"},
		{"big.txt", strings.Repeat("x", MaxTextBytes+1), "exceeds the 1048576-byte limit"},
		{"bad.txt", "caf\xe9", "not valid UTF-8"},
		{"a\x00b", "x", "NUL"},
	} {
		_, err := s.WriteFile(bg, "demo", tc.path, tc.content)
		wantValidation(t, err, tc.want)
	}
	// Nothing leaked outside, and the outside file is untouched.
	if b, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(b) != "secret" {
		t.Fatal("outside file changed")
	}
	for _, n := range []string{"new.txt", "deeper"} {
		if _, err := os.Lstat(filepath.Join(outside, n)); !os.IsNotExist(err) {
			t.Fatalf("%s created outside", n)
		}
	}
	// No temp files are left behind.
	filepath.WalkDir(pkg, func(p string, d os.DirEntry, err error) error {
		if strings.HasPrefix(d.Name(), internalPrefix) {
			t.Errorf("temp file left: %s", p)
		}
		return nil
	})
}

func TestListFiles(t *testing.T) {
	s, pkg, _ := fileFixture(t)
	got, err := s.ListFiles(bg, "demo", ListFilesOptions{Path: ".", MaxEntries: 200})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range got.Entries {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "README.md,SKILL.md,dangling,docs,leak.txt,outdir" || got.Truncated || got.BasePath != "." {
		t.Fatalf("list: %v %+v", names, got)
	}
	for _, e := range got.Entries {
		switch e.Name {
		case "docs":
			if !e.IsDir || e.Size != nil || e.Path != "docs" {
				t.Errorf("docs entry %+v", e)
			}
		case "README.md":
			if e.IsDir || e.Size == nil || *e.Size != 6 {
				t.Errorf("README entry %+v", e)
			}
		case "outdir":
			// A link leading out is listed as what it is, not followed.
			if e.IsDir {
				t.Errorf("outdir followed: %+v", e)
			}
		}
	}
	got, _ = s.ListFiles(bg, "demo", ListFilesOptions{Path: ".", IncludeHidden: true, MaxEntries: 2})
	if len(got.Entries) != 2 || !got.Truncated || got.Entries[0].Name != ".hidden" {
		t.Fatalf("hidden+truncated: %+v", got)
	}
	got, _ = s.ListFiles(bg, "demo", ListFilesOptions{Path: "docs/", MaxEntries: 200})
	if got.BasePath != "docs" || len(got.Entries) != 2 || got.Entries[0].Path != "docs/guide.md" {
		t.Fatalf("subdir: %+v", got)
	}
	// Exactly full is not truncated (the reference's OLD quirk).
	got, _ = s.ListFiles(bg, "demo", ListFilesOptions{Path: "docs", MaxEntries: 2})
	if got.Truncated {
		t.Fatal("exactly full reported truncated")
	}
	for _, tc := range []struct {
		opts ListFilesOptions
		want string
	}{
		{ListFilesOptions{Path: "..", MaxEntries: 10}, "must stay within"},
		{ListFilesOptions{Path: "../..", MaxEntries: 10}, "must stay within"},
		{ListFilesOptions{Path: "/etc", MaxEntries: 10}, "must be relative"},
		{ListFilesOptions{Path: "outdir", MaxEntries: 10}, "must stay within"},
		{ListFilesOptions{Path: "missing", MaxEntries: 10}, "Skill directory not found: missing"},
		{ListFilesOptions{Path: "README.md", MaxEntries: 10}, "Skill directory not found"},
		{ListFilesOptions{Path: ".", MaxEntries: 0}, "max_entries must be a positive integer"},
	} {
		_, err := s.ListFiles(bg, "demo", tc.opts)
		wantValidation(t, err, tc.want)
	}
	_ = pkg
}

// TestFIFOsDoNotBlock plants FIFOs where a sandbox could (skills are
// mounted rw): reads and listings must refuse them, not hang.
func TestFIFOsDoNotBlock(t *testing.T) {
	s, root := testStore(t)
	mustCreate(t, s, "demo", "x")
	pkg := filepath.Join(root, "demo")
	must(t, syscall.Mkfifo(filepath.Join(pkg, "pipe"), 0o644))
	os.MkdirAll(filepath.Join(root, "fifo-skill"), 0o755)
	must(t, syscall.Mkfifo(filepath.Join(root, "fifo-skill", "SKILL.md"), 0o644))
	// Checks run in a goroutine so a hang is reported, not waited for;
	// t.Errorf is safe there, t.Fatal is not.
	check := func(err error, want string) {
		if !errors.Is(err, boxerr.ErrValidation) || !strings.Contains(err.Error(), want) {
			t.Errorf("want a validation error with %q, got %v", want, err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := s.ReadFile(bg, "demo", "pipe")
		check(err, "Skill file not found: pipe")
		_, err = s.ListFiles(bg, "demo", ListFilesOptions{Path: "pipe", MaxEntries: 10})
		check(err, "Skill directory not found")
		_, err = s.WriteFile(bg, "demo", "pipe", "x")
		check(err, "not a regular file")
		if list, err := s.List(bg); err != nil || len(list) != 1 {
			t.Errorf("list: %v %v", list, err)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("blocked on a FIFO")
	}
}
