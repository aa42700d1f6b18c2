package runtime

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/backends"
)

func TestNetworkUpdatesAdopted(t *testing.T) {
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
		{"a session without network has no policy to take",
			backends.Session{SessionID: "s", BackendSessionID: "b1", Sandbox: backends.Sandbox{Network: backends.NetworkOff}}, backends.NetworkOff, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "network")
			u := loadNetworkUpdates(dir, zerolog.Nop())
			if err := u.set(networkRecord{SessionID: "s", BackendSessionID: "b1", Network: open}); err != nil {
				t.Fatal(err)
			}
			// What a restart reads back.
			u = loadNetworkUpdates(dir, zerolog.Nop())
			if got := u.adopted(tt.info).Network; got != tt.want {
				t.Errorf("network %s, want %s", got, tt.want)
			}
			_, err := os.Stat(u.recs.path("s"))
			if _, ok := u.policy("s"); ok != tt.keepRecord || (err == nil) != tt.keepRecord {
				t.Errorf("record kept: in memory %v, on disk %v; want %v", ok, err == nil, tt.keepRecord)
			}
		})
	}
}

func TestNetworkUpdatesIgnoreDamage(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "junk.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	u := loadNetworkUpdates(dir, zerolog.Nop())
	if len(u.byID) != 0 {
		t.Fatalf("loaded %v from a damaged record", u.byID)
	}
}
