package bwrap

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/atomicfile"
)

// Session directory layout: <StateDir>/bwrap/<InstanceID>/<dir>/ holding
// session.json, disk.img and fs/ (see disk.go), and in fs/ these entries.
const (
	workspaceDir = "workspace"
	tmpDir       = "tmp"
	homeDir      = "home"
	sessionFile  = "session.json"

	maxSanitisedLen = 32
	// stateFormat 2: storage moved into fs/ (a disk of its own). Format 1
	// sessions are not adopted.
	stateFormat = 2
)

// instanceIDRe bounds what an instance id may be: it becomes a directory
// name and a cgroup name, and two ids must never collapse into one (which a
// sanitising rewrite could do), so ids are validated, not rewritten.
var instanceIDRe = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$`)

// sessionDirRe matches the directory names newSessionDirName makes; every
// BackendSessionID coming back from the runtime is checked against it
// before it is joined to a path.
var sessionDirRe = regexp.MustCompile(`^[a-z0-9_-][a-z0-9_.-]{0,31}-[0-9a-f]{8}$`)

// sanitise turns a session id into a directory-name stem the way the
// reference names its containers: runs of characters outside
// [a-zA-Z0-9_.-] become "-", "-" and "." are trimmed at both ends (no hidden
// or "." / ".." names), lower-cased, "session" when nothing is left, cut to
// 32 characters.
func sanitise(id string) string {
	var b strings.Builder
	dash := false
	for _, r := range id {
		ok := r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-')
		if !ok {
			if !dash {
				b.WriteByte('-')
			}
			dash = true
			continue
		}
		dash = false
		b.WriteRune(r)
	}
	s := strings.ToLower(strings.Trim(b.String(), "-."))
	if len(s) > maxSanitisedLen {
		s = strings.TrimRight(s[:maxSanitisedLen], "-.")
	}
	if s == "" {
		s = "session"
	}
	return s
}

func newSessionDirName(sessionID string) string {
	return sanitise(sessionID) + "-" + randomHex(4)
}

func randomHex(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

// stateFile is what session.json holds. InstanceID is repeated inside so a
// file copied into another installation's directory is still recognised as
// foreign.
type stateFile struct {
	Format     int              `json:"format"`
	InstanceID string           `json:"instance_id"`
	Session    backends.Session `json:"session"`
	// Sandbox is a persistent session's running sandbox (persist.go).
	Sandbox *sandboxRecord `json:"sandbox,omitempty"`
}

func writeState(dir string, st stateFile) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, sessionFile), append(data, '\n'), 0o600)
}

func readState(dir string) (stateFile, error) {
	var st stateFile
	data, err := os.ReadFile(filepath.Join(dir, sessionFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("%s: %w", filepath.Join(dir, sessionFile), err)
	}
	if st.Format != stateFormat {
		return st, fmt.Errorf("%s: unknown format %d", filepath.Join(dir, sessionFile), st.Format)
	}
	return st, nil
}

// touch records the session's last use in the mtime of session.json, so
// Adopt can report a meaningful LastUsedAt after a restart.
func touch(dir string) {
	now := time.Now()
	_ = os.Chtimes(filepath.Join(dir, sessionFile), now, now)
}

// removeTree deletes a session directory. Commands may have left
// directories without write or search permission (chmod 000), which a
// non-root boxrt cannot descend into, so on failure permissions of
// directories are repaired and the removal retried. WalkDir does not follow
// symlinks, and only entries that lstat as directories are chmod-ed.
func removeTree(dir string) error {
	err := os.RemoveAll(dir)
	// Each pass opens up one more level of unreadable directories (WalkDir
	// cannot descend into one until it has been chmod-ed).
	for pass := 0; err != nil && pass < 8; pass++ {
		_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, _ error) error {
			if d != nil && d.IsDir() {
				_ = os.Chmod(path, 0o700)
			}
			return nil
		})
		err = os.RemoveAll(dir)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
