package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/internal/atomicfile"
)

// sessionRecords keeps one JSON record per session in a directory of the
// state directory: <dir>/<sha256 of the session id>.json, 0600 (a record
// may hold secrets, e.g. a process's environment), written to a temp name
// and renamed.
type sessionRecords struct {
	dir string
	log zerolog.Logger
}

func (rs sessionRecords) path(sessionID string) string {
	sum := sha256.Sum256([]byte(sessionID))
	return filepath.Join(rs.dir, hex.EncodeToString(sum[:])+".json")
}

func (rs sessionRecords) write(sessionID string, rec any) error {
	if err := os.MkdirAll(rs.dir, 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(rs.path(sessionID), data, 0o600)
}

// load reads the session's record into rec; false when there is none or it
// cannot be read.
func (rs sessionRecords) load(sessionID string, rec any) bool {
	data, err := os.ReadFile(rs.path(sessionID))
	return err == nil && json.Unmarshal(data, rec) == nil
}

func (rs sessionRecords) drop(sessionID string) {
	if err := os.Remove(rs.path(sessionID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		rs.log.Warn().Err(err).Str("session_id", sessionID).Str("dir", rs.dir).Msg("cannot remove session record")
	}
}
