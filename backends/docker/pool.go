package docker

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/atomicfile"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.Pooler = (*Backend)(nil)

// claimSuffix names a claim record: <StateDir>/docker/<instance>/<container>.claim
// holds the session a pooled container was handed to. Labels cannot change
// after creation, so Adopt reads the owner from here.
const claimSuffix = ".claim"

type claimRecord struct {
	SessionID string           `json:"session_id"`
	Sandbox   backends.Sandbox `json:"sandbox"`
	CreatedAt time.Time        `json:"created_at"`
}

func (b *Backend) claimPath(name string) string {
	return filepath.Join(b.stateDir, "docker", b.instance, name+claimSuffix)
}

// Claim implements backends.Pooler.
func (b *Backend) Claim(_ context.Context, info backends.Session, spec backends.SandboxSpec) (backends.Session, error) {
	if b.stateDir == "" {
		return info, boxerr.Failure("docker backend: pooling needs a state directory")
	}
	name := info.BackendSessionID
	claimed := spec.Session(Name, name)
	claimed.CreatedAt = time.Now().UTC()
	claimed.LastUsedAt = claimed.CreatedAt
	data, err := json.Marshal(claimRecord{SessionID: spec.SessionID, Sandbox: claimed.Sandbox, CreatedAt: claimed.CreatedAt})
	if err == nil {
		err = os.MkdirAll(filepath.Dir(b.claimPath(name)), 0o700)
	}
	if err == nil {
		err = atomicfile.Write(b.claimPath(name), data, 0o600)
	}
	if err != nil {
		return info, boxerr.Failure("docker backend: claiming pooled container %s: %v", name, err).Wrap(err)
	}
	return claimed, nil
}

// applyClaim replaces a pooled container's label-made session with the one
// it was handed to, if any.
func (b *Backend) applyClaim(info backends.Session) backends.Session {
	if b.stateDir == "" {
		return info
	}
	data, err := os.ReadFile(b.claimPath(info.BackendSessionID))
	if err != nil {
		return info
	}
	var c claimRecord
	if json.Unmarshal(data, &c) != nil || c.SessionID == "" {
		return info
	}
	info.SessionID, info.Sandbox, info.CreatedAt = c.SessionID, c.Sandbox, c.CreatedAt
	return info
}
