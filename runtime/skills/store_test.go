package skills

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestCreateGetList(t *testing.T) {
	s, root := testStore(t)
	list, err := s.List(bg)
	if err != nil || len(list) != 0 {
		t.Fatalf("empty store: %v %v", list, err)
	}
	sk, err := s.Create(bg, Input{Name: ptr(" demo "), DisplayName: ptr("Demo"), Description: ptr("Demo skill"), Instructions: ptr("Do it.")})
	if err != nil {
		t.Fatal(err)
	}
	if sk.Name != "demo" || sk.DisplayName != "Demo" || sk.Description != "Demo skill" || sk.Instructions != "Do it." ||
		sk.PackageRoot != filepath.Join(root, "demo") || sk.EntryFile != "SKILL.md" || sk.PythonProject ||
		!strings.HasSuffix(sk.CreatedAt, "+00:00") || !strings.HasSuffix(sk.UpdatedAt, "+00:00") {
		t.Fatalf("created %+v", sk)
	}
	b, _ := os.ReadFile(filepath.Join(root, "demo", "SKILL.md"))
	if string(b) != "---\nname: demo\ndisplay_name: Demo\ndescription: Demo skill\n---\n\nDo it." {
		t.Fatalf("SKILL.md = %q", b)
	}
	got, err := s.Get(bg, "demo")
	if err != nil || got == nil || got.Name != "demo" {
		t.Fatalf("get: %v %v", got, err)
	}
	if got, err := s.Get(bg, "missing"); err != nil || got != nil {
		t.Fatalf("get missing: %v %v", got, err)
	}
	_, err = s.Get(bg, " ")
	wantValidation(t, err, "required")

	// Newest first; python_project; lowercase skill.md and a directory
	// name fallback; invalid names and corrupt packages are invisible.
	time.Sleep(10 * time.Millisecond)
	mustCreate(t, s, "second", "x")
	writeFile(t, filepath.Join(root, "py", "skill.md"), "no front matter")
	writeFile(t, filepath.Join(root, "py", "requirements.txt"), "")
	writeFile(t, filepath.Join(root, "bad", "SKILL.md"), "---\nname: bad name!\n---\n")
	writeFile(t, filepath.Join(root, "huge", "SKILL.md"), strings.Repeat("x", MaxTextBytes+1))
	writeFile(t, filepath.Join(root, "latin1", "SKILL.md"), "caf\xe9")
	writeFile(t, filepath.Join(root, "nested", "a", "b", "deep", "SKILL.md"), "---\nname: deep\n---\n")
	list, err = s.List(bg)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]Skill{}
	for _, sk := range list {
		names[sk.Name] = sk
	}
	if len(list) != 4 || names["py"].EntryFile != "skill.md" || !names["py"].PythonProject || names["deep"].Name == "" {
		t.Fatalf("list = %+v", list)
	}
	if list[len(list)-1].Name != "demo" {
		t.Fatalf("not newest first: %v", list)
	}
}

func TestCreateRefusals(t *testing.T) {
	s, root := testStore(t)
	mustCreate(t, s, "demo", "x")
	writeFile(t, filepath.Join(root, "demo", "inner", "SKILL.md"), "nested")
	if err := os.Mkdir(filepath.Join(root, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "pkg", "SKILL.md"), "outside")
	if err := os.Symlink(filepath.Join(outside, "pkg"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		in   Input
		want string
	}{
		{"duplicate", Input{Name: ptr("demo")}, `Skill with name "demo" already exists`},
		{"no name", Input{}, "Skill name is required"},
		{"blank name", Input{Name: ptr("  ")}, "Skill name is required"},
		{"65 chars", Input{Name: ptr(strings.Repeat("a", 65))}, "cannot exceed 64"},
		{"slash", Input{Name: ptr("a/b")}, "can only contain"},
		{"dotdot", Input{Name: ptr("..")}, "can only contain"},
		{"package_root outside", Input{Name: ptr("x"), PackageRoot: ptr(filepath.Join(outside, "pkg"))}, "must stay within the skill root"},
		{"package_root symlink out", Input{Name: ptr("x"), PackageRoot: ptr(filepath.Join(root, "link"))}, "must stay within the skill root"},
		{"package_root dotdot", Input{Name: ptr("x"), PackageRoot: ptr("../")}, "must stay within the skill root"},
		{"package_root NUL", Input{Name: ptr("x"), PackageRoot: ptr("a\x00b")}, "NUL"},
		{"package_root missing", Input{Name: ptr("x"), PackageRoot: ptr("nope")}, "Directory does not exist"},
		{"package_root root", Input{Name: ptr("x"), PackageRoot: ptr(root)}, "not the root itself"},
		{"package_root without SKILL.md", Input{Name: ptr("x"), PackageRoot: ptr(filepath.Join(root, "empty"))}, "No SKILL.md found"},
		{"package_root inside another skill", Input{Name: ptr("x"), PackageRoot: ptr("demo/inner")}, "would not be listed"},
		{"adopt other skill", Input{Name: ptr("x"), PackageRoot: ptr(filepath.Join(root, "demo"))}, "renaming skills is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Create(bg, tc.in)
			wantValidation(t, err, tc.want)
		})
	}
	// A directory that already holds a package is not overwritten.
	writeFile(t, filepath.Join(root, "taken", "SKILL.md"), "---\nname: other\n---\n")
	_, err := s.Create(bg, Input{Name: ptr("taken")})
	wantValidation(t, err, "Skill directory already exists")
	// Nor is a directory holding nested packages (they would be hidden).
	writeFile(t, filepath.Join(root, "repo", "packages", "alpha", "SKILL.md"), "---\nname: alpha\n---\n")
	_, err = s.Create(bg, Input{Name: ptr("repo")})
	wantValidation(t, err, "holds other skills")
	// A planted symlink at <root>/<name> is not written through.
	if err := os.Symlink(outside, filepath.Join(root, "planted")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Create(bg, Input{Name: ptr("planted")})
	wantValidation(t, err, "not a directory")
	if _, err := os.Stat(filepath.Join(outside, "SKILL.md")); !os.IsNotExist(err) {
		t.Fatal("wrote through a symlink")
	}
}

func TestCreateAdoptInPlace(t *testing.T) {
	s, root := testStore(t)
	writeFile(t, filepath.Join(root, "repo", "pkg", "SKILL.md"), "---\nname: bad name!\ndescription: Imported\n---\n\nImported body")
	sk, err := s.Create(bg, Input{Name: ptr("adopted"), Description: ptr(""), PackageRoot: ptr("repo/pkg")})
	if err != nil {
		t.Fatal(err)
	}
	if sk.PackageRoot != filepath.Join(root, "repo", "pkg") || sk.Description != "Imported" || sk.Instructions != "Imported body" {
		t.Fatalf("adopted %+v", sk)
	}
}

func TestUpdate(t *testing.T) {
	s, root := testStore(t)
	mustCreate(t, s, "demo", "old")
	sk, err := s.Update(bg, "demo", Input{Instructions: ptr("new"), DisplayName: ptr("Demo 2")})
	if err != nil || sk.Instructions != "new" || sk.DisplayName != "Demo 2" || sk.Description != "about demo" {
		t.Fatalf("update: %+v %v", sk, err)
	}
	// Same name and same package_root are fine.
	if _, err := s.Update(bg, "demo", Input{Name: ptr("demo"), PackageRoot: ptr(filepath.Join(root, "demo"))}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Update(bg, "demo", Input{Name: ptr("renamed")})
	wantValidation(t, err, "Renaming skills is not supported")
	os.MkdirAll(filepath.Join(root, "elsewhere"), 0o755)
	_, err = s.Update(bg, "demo", Input{PackageRoot: ptr(filepath.Join(root, "elsewhere"))})
	wantValidation(t, err, "Updating package_root is not supported")
	_, err = s.Update(bg, "missing", Input{})
	wantValidation(t, err, `Skill "missing" not found`)
	_, err = s.Update(bg, "../demo", Input{})
	wantValidation(t, err, "can only contain")
}

func TestDelete(t *testing.T) {
	s, root := testStore(t)
	mustCreate(t, s, "demo", "x")
	writeFile(t, filepath.Join(root, "repo", "packages", "alpha", "SKILL.md"), "---\nname: alpha\n---\n")
	writeFile(t, filepath.Join(root, "repo", "packages", "beta", "SKILL.md"), "---\nname: beta\n---\n")
	if err := s.Delete(bg, "demo"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "demo")); !os.IsNotExist(err) {
		t.Fatal("demo still on disk")
	}
	// Deleting one skill of a multi-skill tree leaves its sibling.
	if err := s.Delete(bg, "alpha"); err != nil {
		t.Fatal(err)
	}
	if sk, _ := s.Get(bg, "beta"); sk == nil {
		t.Fatal("beta went with alpha")
	}
	if err := s.Delete(bg, "beta"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "repo")); !os.IsNotExist(err) {
		t.Fatal("empty parents not pruned")
	}
	wantValidation(t, s.Delete(bg, "demo"), `Skill "demo" not found`)
	wantValidation(t, s.Delete(bg, ".."), "can only contain")
	wantValidation(t, s.Delete(bg, "a/b"), "can only contain")

	// A skill at the root itself is not deletable; one outside the root
	// (through a symlinked directory) is not even visible.
	writeFile(t, filepath.Join(root, "SKILL.md"), "---\nname: rootskill\n---\n")
	wantValidation(t, s.Delete(bg, "rootskill"), "Only managed skills")
	os.Remove(filepath.Join(root, "SKILL.md"))
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "SKILL.md"), "---\nname: outside\n---\n")
	os.Symlink(outside, filepath.Join(root, "outside"))
	wantValidation(t, s.Delete(bg, "outside"), `Skill "outside" not found`)
	if _, err := os.Stat(filepath.Join(outside, "SKILL.md")); err != nil {
		t.Fatal("outside package touched")
	}
}

func TestScan(t *testing.T) {
	s, root := testStore(t)
	writeFile(t, filepath.Join(root, "one", "SKILL.md"), "---\nname: one\n---\n")
	writeFile(t, filepath.Join(root, "sub", "inner", "SKILL.md"), "---\nname: inner\n---\n")
	writeFile(t, filepath.Join(root, "multi", "a", "SKILL.md"), "---\nname: a\n---\n")
	writeFile(t, filepath.Join(root, "multi", "b", "SKILL.md"), "---\nname: b\n---\n")
	writeFile(t, filepath.Join(root, "deep", "1", "2", "3", "SKILL.md"), "---\nname: deep\n---\n")
	os.MkdirAll(filepath.Join(root, "none"), 0o755)
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "SKILL.md"), "---\nname: outside\n---\n")
	os.Symlink(outside, filepath.Join(root, "escape"))

	if sk, err := s.Scan(bg, filepath.Join(root, "one")); err != nil || sk.Name != "one" {
		t.Fatalf("scan one: %+v %v", sk, err)
	}
	if sk, err := s.Scan(bg, "sub"); err != nil || sk.Name != "inner" {
		t.Fatalf("scan sub: %+v %v", sk, err)
	}
	_, err := s.Scan(bg, "multi")
	wantValidation(t, err, "Multiple skill directories found")
	_, err = s.Scan(bg, "deep")
	wantValidation(t, err, "No SKILL.md found", "max depth: 2")
	_, err = s.Scan(bg, "none")
	wantValidation(t, err, "No SKILL.md found")
	_, err = s.Scan(bg, "missing")
	wantValidation(t, err, "Directory does not exist")
	_, err = s.Scan(bg, outside)
	wantValidation(t, err, "scan path must stay within the skill root")
	_, err = s.Scan(bg, "escape")
	wantValidation(t, err, "scan path must stay within the skill root")
	_, err = s.Scan(bg, "../../..")
	wantValidation(t, err, "must stay within")
	_, err = s.Scan(bg, "")
	wantValidation(t, err, "required")
}

func TestDiscoveryDoesNotFollowSymlinks(t *testing.T) {
	s, root := testStore(t)
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "pkg", "SKILL.md"), "---\nname: outside\n---\n")
	os.Symlink(filepath.Join(outside, "pkg"), filepath.Join(root, "pkg"))
	os.Symlink(outside, filepath.Join(root, "dir"))
	// An entry file that is a symlink leading out is not read either.
	os.MkdirAll(filepath.Join(root, "sneaky"), 0o755)
	writeFile(t, filepath.Join(outside, "secret.md"), "---\nname: sneaky\n---\nsecret")
	os.Symlink(filepath.Join(outside, "secret.md"), filepath.Join(root, "sneaky", "SKILL.md"))
	list, err := s.List(bg)
	if err != nil || len(list) != 0 {
		t.Fatalf("list = %+v, %v", list, err)
	}
}

func TestDiscoveryCaps(t *testing.T) {
	defer func(old int) { discoveryEntryLimit = old }(discoveryEntryLimit)
	discoveryEntryLimit = 300
	s, root := testStore(t)
	for i := 0; i < 300; i++ {
		if err := os.Mkdir(filepath.Join(root, "d"+strconv.Itoa(i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.List(bg); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if err := os.Mkdir(filepath.Join(root, "one-more"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := s.List(bg)
	if !errors.Is(err, boxerr.ErrBox) || !strings.Contains(err.Error(), "entry limit (300 entries)") {
		t.Fatalf("over the limit: %v", err)
	}
}

func TestRootProviderChangesApply(t *testing.T) {
	base := t.TempDir()
	var cur atomic.Value
	cur.Store(filepath.Join(base, "a"))
	s := New(func() string { return cur.Load().(string) }, nil, WithTempDir(t.TempDir()))
	defer s.Close()
	mustCreate(t, s, "one", "x")
	cur.Store(filepath.Join(base, "b"))
	if list, _ := s.List(bg); len(list) != 0 {
		t.Fatalf("new root still lists %v", list)
	}
	if _, err := os.Stat(filepath.Join(base, "a", "one", "SKILL.md")); err != nil {
		t.Fatal(err)
	}
	_, err := s.PackageRoot(bg, "one")
	wantValidation(t, err, "not found")
	cur.Store(filepath.Join(base, "a"))
	if p, err := s.PackageRoot(bg, "one"); err != nil || !strings.HasSuffix(p, "/a/one") {
		t.Fatalf("PackageRoot = %q, %v", p, err)
	}
}
