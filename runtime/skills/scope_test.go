package skills

import (
	"os"
	"path/filepath"
	"testing"
)

func TestScopedNamespaces(t *testing.T) {
	s, _ := testStore(t)
	tests := []struct {
		name, namespace string
		ok              bool
	}{
		{name: "workspace namespace", namespace: "ws-695136eeae1cb9b6af4a8226", ok: true},
		{name: "empty", namespace: ""},
		{name: "dot", namespace: "."},
		{name: "dot dot", namespace: ".."},
		{name: "slash", namespace: "a/b"},
		{name: "backslash", namespace: `a\b`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := s.Scoped(tc.namespace)
			if !tc.ok {
				wantValidation(t, err, "Invalid Workspace skill namespace")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			again, _ := s.Scoped(tc.namespace)
			if again != v {
				t.Fatal("views are not cached")
			}
			if _, err := v.Scoped("x"); err == nil {
				t.Fatal("a view was scoped again")
			}
		})
	}
}

// TestScopedIsolation: each Workspace's view holds its own skills; the
// unscoped store keeps its own and lists none of the views'.
func TestScopedIsolation(t *testing.T) {
	s, root := testStore(t)
	a, err := s.Scoped("ws-a")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Scoped("ws-b")
	sk := mustCreate(t, a, "s1", "from a")
	if want := filepath.Join(root, TenantsDir, "ws-a", "s1"); sk.PackageRoot != want {
		t.Fatalf("package_root %s, want %s", sk.PackageRoot, want)
	}
	if fi, err := os.Stat(filepath.Join(root, TenantsDir, "ws-a")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("scoped root: %v %v", fi, err)
	}
	mustCreate(t, s, "s0", "single tenant")

	names := func(st *Store) []string {
		t.Helper()
		list, err := st.List(bg)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sk := range list {
			out = append(out, sk.Name)
		}
		return out
	}
	for _, c := range []struct {
		name  string
		store *Store
		want  string
	}{{"workspace a", a, "s1"}, {"workspace b", b, ""}, {"unscoped", s, "s0"}} {
		got := names(c.store)
		if (c.want == "" && len(got) != 0) || (c.want != "" && (len(got) != 1 || got[0] != c.want)) {
			t.Errorf("%s lists %v, want [%s]", c.name, got, c.want)
		}
	}
	if _, err := b.PackageRoot(bg, "s1"); err == nil {
		t.Fatal("workspace b resolved workspace a's skill")
	}
	if p, err := a.PackageRoot(bg, "s1"); err != nil || p != sk.PackageRoot {
		t.Fatalf("workspace a: %s %v", p, err)
	}
	_, err = b.Scan(bg, sk.PackageRoot)
	wantValidation(t, err, "must stay within the skill root")
	_, err = b.Create(bg, Input{Name: ptr("s1"), PackageRoot: ptr(sk.PackageRoot)})
	wantValidation(t, err, "must stay within the skill root")
	_, err = s.Create(bg, Input{Name: ptr(TenantsDir)})
	wantValidation(t, err, "reserved")
	_, err = s.Create(bg, Input{Name: ptr("s1"), PackageRoot: ptr(sk.PackageRoot)})
	wantValidation(t, err, "would not be listed")

	// Views share the base store's uploads: a file_key sent without a
	// Workspace is installable from one.
	if a.work != s.work {
		t.Fatal("a view does not share the store's work state")
	}
}
