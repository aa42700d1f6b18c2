package runtime

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/egress"
)

func TestEgressRecordsAdopted(t *testing.T) {
	open := backends.NetworkMode(`{"allow":["pypi.org"]}`)
	tests := []struct {
		name       string
		info       backends.Session
		want       backends.NetworkMode
		keepRecord bool
	}{
		{"the update wins over the creation policy",
			backends.Session{SessionID: "s", BackendSessionID: "b1", Sandbox: backends.Sandbox{Network: `{"allow":[]}`}}, open, true},
		{"another sandbox of the same id: stale, dropped",
			backends.Session{SessionID: "s", BackendSessionID: "b2", Sandbox: backends.Sandbox{Network: `{"allow":[]}`}}, `{"allow":[]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "network")
			er := loadEgressRecords(dir, func() string { return "" }, zerolog.Nop())
			b1 := backends.Session{SessionID: "s", BackendSessionID: "b1"}
			if err := er.update(b1, func(r *egressRecord) { r.Network = open }); err != nil {
				t.Fatal(err)
			}
			// What a restart reads back.
			er = loadEgressRecords(dir, func() string { return "" }, zerolog.Nop())
			if got := er.adopted(tt.info).Network; got != tt.want {
				t.Errorf("network %s, want %s", got, tt.want)
			}
			_, err := os.Stat(er.recs.path("s"))
			if _, ok := er.restore("s"); ok != tt.keepRecord || (err == nil) != tt.keepRecord {
				t.Errorf("record kept: in memory %v, on disk %v; want %v", ok, err == nil, tt.keepRecord)
			}
		})
	}
}

// TestEgressRecordsRestoreSecrets: a value comes back as it was, a ref is
// read from the store again, and one the store lost restores no secret.
func TestEgressRecordsRestoreSecrets(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "secrets.json")
	if err := os.WriteFile(store, []byte(`{"api":"from-store"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	er := loadEgressRecords(filepath.Join(dir, "network"), func() string { return store }, zerolog.Nop())
	info := backends.Session{SessionID: "s", BackendSessionID: "b"}
	id := egress.Identity{Placeholders: map[string]string{"A": "p1", "B": "p2"}}
	params := []SecretParam{{Name: "A", Value: "v", Hosts: []string{"a.test"}}, {Name: "B", Ref: "api", Hosts: []string{"b.test"}, Query: true}}
	if err := er.update(info, func(r *egressRecord) { r.Secrets, r.Identity = params, id }); err != nil {
		t.Fatal(err)
	}
	er = loadEgressRecords(filepath.Join(dir, "network"), func() string { return store }, zerolog.Nop())
	got, ok := er.restore("s")
	if !ok || got.Policy != nil || len(got.Secrets) != 2 || got.Secrets[0].Value != "v" || got.Secrets[1].Value != "from-store" ||
		!got.Secrets[1].Query || got.Identity.Placeholders["B"] != "p2" {
		t.Fatalf("restored %+v %v", got, ok)
	}
	if err := os.WriteFile(store, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := er.restore("s"); got.Secrets != nil {
		t.Fatalf("a ref the store lost restored %+v", got.Secrets)
	}
	if fi, err := os.Stat(er.recs.path("s")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record file: %v %v", fi, err)
	}
}

func TestEgressRecordsIgnoreDamage(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "junk.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	er := loadEgressRecords(dir, func() string { return "" }, zerolog.Nop())
	if len(er.byID) != 0 {
		t.Fatalf("loaded %v from a damaged record", er.byID)
	}
}
