package snapshots

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Modes of a snapshot.
const (
	// ModeFilesystem saves files: the workspace, the sandbox's writable
	// root filesystem layer (installed packages), /tmp and /home where the
	// backend keeps them.
	ModeFilesystem = "filesystem"
	// ModeFull would add memory and processes (CRIU); see
	// docs/operations.md for where it works.
	ModeFull = "full"
)

// Manifest describes one snapshot. ID, Digest, SizeBytes, RawBytes and
// CreatedAt are filled in by Put.
type Manifest struct {
	ID        string    `json:"snapshot_id"`
	SessionID string    `json:"session_id"`
	Backend   string    `json:"backend"`
	Mode      string    `json:"mode"`
	CreatedAt time.Time `json:"created_at"`
	// Spec is the source session's sandbox (backends.Sandbox as JSON); a
	// restore starts a session with it.
	Spec json.RawMessage `json:"spec"`
	// Digest is "sha256:<hex>" of the compressed archive.
	Digest string `json:"digest"`
	// SizeBytes is the compressed archive's size, RawBytes the tar's.
	SizeBytes int64 `json:"size_bytes"`
	RawBytes  int64 `json:"raw_bytes"`
	// Notes say what the snapshot left out (a host_path workspace…).
	Notes []string `json:"notes,omitempty"`
	// HostPathIncluded: the host_path workspace's files are in the
	// archive; a restore puts them in a workspace of the session's own.
	HostPathIncluded bool `json:"host_path_included,omitempty"`
	// Seal authenticates a stored manifest (Local: an HMAC under the
	// store's key). Only the store sets and reads it; it is empty in every
	// manifest a Store returns.
	Seal string `json:"seal,omitempty"`
}

// ErrNotExist is the answer for an unknown snapshot id (and for one the
// caller's namespace does not hold, so as not to tell it exists).
func ErrNotExist(id string) error {
	return boxerr.Validation("snapshot_id", "snapshot %s does not exist", id).With("snapshot_id", id)
}

// Store keeps snapshots. Implementations are safe for concurrent use.
type Store interface {
	// Put stores m with the tar stream read from archive and returns the
	// completed manifest. Nothing is visible until it returns nil.
	Put(ctx context.Context, m Manifest, archive io.Reader) (Manifest, error)
	// Get returns a manifest; an unknown id is a BoxValidationError on
	// snapshot_id.
	Get(ctx context.Context, id string) (Manifest, error)
	// Open verifies the snapshot and returns its tar stream; a snapshot
	// that does not verify is BoxSnapshotCorruptedError.
	Open(ctx context.Context, id string) (Manifest, io.ReadCloser, error)
	// List returns every manifest, oldest first.
	List(ctx context.Context) ([]Manifest, error)
	// Delete removes a snapshot (and its archive unless another snapshot
	// shares it).
	Delete(ctx context.Context, id string) error
}
