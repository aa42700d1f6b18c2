package e2bapi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/atomicfile"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// A sandbox's E2B record (its access token, template, envVars, metadata,
// timeout) is kept in the state directory, one file per sandbox, so that
// after a restart the SDK's handle still works: the same token opens the
// same sandbox and its timeout still runs. Without a directory (tests of
// the handler alone) records live in memory only.

// recordsDir is the records' directory under the state directory.
const recordsDir = "e2b"

// maxRecordBytes bounds a record file read back: envVars and metadata are
// bounded by the runtime's spec limits well below it.
const maxRecordBytes = 4 << 20

// recordJSON is a record on disk.
type recordJSON struct {
	Physical  string            `json:"physical"`
	Logical   string            `json:"logical"`
	Placement tenant.Placement  `json:"placement"`
	Scoped    bool              `json:"scoped"`
	Token     string            `json:"token"`
	Template  string            `json:"template"`
	Started   time.Time         `json:"started"`
	Box       backends.Sandbox  `json:"box"`
	Envs      map[string]string `json:"envs,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	AutoPause bool              `json:"auto_pause,omitempty"`
	// EndAt is when the timeout ends the sandbox; zero: none (paused).
	EndAt time.Time `json:"end_at"`
}

// recordStore writes and reads the records of one state directory.
type recordStore struct{ dir string }

// fileOf is the record file of a physical session id: hashed, since ids
// of tenants' sessions carry characters a file name should not.
func (st recordStore) fileOf(physical string) string {
	sum := sha256.Sum256([]byte(physical))
	return filepath.Join(st.dir, hex.EncodeToString(sum[:16])+".json")
}

// save writes sb's record; a failure is returned for the caller to log
// (the sandbox works on, its record is only at risk at the next restart).
func (st recordStore) save(sb *sandbox) error {
	if st.dir == "" {
		return nil
	}
	sb.mu.Lock()
	rec := recordJSON{Physical: sb.physical, Logical: sb.logical, Placement: sb.placement, Scoped: sb.scoped, Token: sb.token,
		Template: sb.template, Started: sb.started, Box: sb.box, Envs: sb.envs, Metadata: sb.metadata, AutoPause: sb.autoPause,
		EndAt: sb.endAt}
	sb.mu.Unlock()
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(st.dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(st.fileOf(sb.physical), data, 0o600)
}

func (st recordStore) remove(physical string) error {
	if st.dir == "" {
		return nil
	}
	if err := os.Remove(st.fileOf(physical)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// load reads every record; a file that does not parse, or is not the
// record its name says, is reported and removed (records are boxrt's
// own: such a file is a torn or foreign one, and keeping it would only
// fail again).
func (st recordStore) load() (recs []recordJSON, problems []error) {
	if st.dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(st.dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			problems = append(problems, err)
		}
		return nil, problems
	}
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(st.dir, name)
		if !e.Type().IsRegular() {
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			// A write cut short left its temporary file: load runs before
			// any write of this boxrt, so none is in progress.
			_ = os.Remove(path)
			continue
		}
		rec, err := readRecord(path)
		if err == nil && st.fileOf(rec.Physical) != path {
			err = errors.New("its name is not its sandbox's")
		}
		if err != nil {
			problems = append(problems, fmt.Errorf("e2b record %s: %v; removed", path, err))
			_ = os.Remove(path)
			continue
		}
		recs = append(recs, rec)
	}
	return recs, problems
}

func readRecord(path string) (recordJSON, error) {
	var rec recordJSON
	f, err := os.Open(path)
	if err != nil {
		return rec, err
	}
	defer f.Close()
	d := json.NewDecoder(&limitedReader{f: f, left: maxRecordBytes})
	d.DisallowUnknownFields()
	if err := d.Decode(&rec); err != nil {
		return rec, err
	}
	if rec.Physical == "" || rec.Logical == "" || rec.Token == "" {
		return rec, errors.New("physical, logical and token are required")
	}
	return rec, nil
}

// limitedReader fails (rather than ends) past its bound, so an oversized
// file is an error, not a truncated record.
type limitedReader struct {
	f    *os.File
	left int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, fmt.Errorf("larger than %d bytes", maxRecordBytes)
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.f.Read(p)
	l.left -= int64(n)
	return n, err
}

// sandboxOfRecord is the in-memory sandbox of a record read back.
func sandboxOfRecord(rec recordJSON) *sandbox {
	return &sandbox{physical: rec.Physical, logical: rec.Logical, placement: rec.Placement, scoped: rec.Scoped, token: rec.Token,
		template: rec.Template, started: rec.Started, box: rec.Box, envs: rec.Envs, metadata: rec.Metadata, autoPause: rec.AutoPause,
		endAt: rec.EndAt, procs: map[uint32]*command{}}
}
