package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/egress"
)

// egressRecord is what a session's egress must keep across a boxrt
// restart, which a backend re-attaching an adopted sandbox does not know:
// the policy box_update_network last gave it ("" before any update) and,
// for a persistent session, its secrets as the spec gave them (a ref is
// read from the store again) with their identity (the placeholders in
// its processes' environment, the CA in its trust bundle).
type egressRecord struct {
	SessionID        string               `json:"session_id"`
	BackendSessionID string               `json:"backend_session_id"`
	Network          backends.NetworkMode `json:"network,omitempty"`
	Secrets          []SecretParam        `json:"secrets,omitempty"`
	Identity         egress.Identity      `json:"identity"`
}

// egressRecords keeps the records in <state dir>/network/ (keyed by the
// physical session id, 0600: secret values and the CA key are in them),
// all read at start. The proxy asks here first when a sandbox is attached
// (egress.Config.Restore), and adopt corrects the sessions' info.
type egressRecords struct {
	recs        sessionRecords
	secretsFile func() string // egress.secrets_file, for refs
	mu          sync.Mutex
	byID        map[string]egressRecord
}

func loadEgressRecords(dir string, secretsFile func() string, log zerolog.Logger) *egressRecords {
	er := &egressRecords{recs: sessionRecords{dir: dir, log: log}, secretsFile: secretsFile, byID: map[string]egressRecord{}}
	entries, _ := os.ReadDir(dir) // none yet: nothing recorded
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		var rec egressRecord
		if err != nil || json.Unmarshal(data, &rec) != nil || er.recs.path(rec.SessionID) != path {
			// A temp file a crash left, or damage: the session keeps the
			// policy it was created with.
			log.Warn().Str("file", path).Msg("ignoring an unreadable egress record")
			continue
		}
		er.byID[rec.SessionID] = rec
	}
	return er
}

// update changes the record of info (a fresh one when there is none or it
// was another sandbox's) and writes it before anything uses it: what is
// in force must also be what a restart finds.
func (er *egressRecords) update(info backends.Session, change func(*egressRecord)) error {
	er.mu.Lock()
	defer er.mu.Unlock()
	rec, ok := er.byID[info.SessionID]
	if !ok || rec.BackendSessionID != info.BackendSessionID {
		rec = egressRecord{SessionID: info.SessionID, BackendSessionID: info.BackendSessionID}
	}
	change(&rec)
	if err := er.recs.write(rec.SessionID, rec); err != nil {
		return err
	}
	er.byID[rec.SessionID] = rec
	return nil
}

// drop forgets the session's record (deleted, or a new session of its id).
func (er *egressRecords) drop(sessionID string) {
	er.mu.Lock()
	defer er.mu.Unlock()
	if _, ok := er.byID[sessionID]; ok {
		delete(er.byID, sessionID)
		er.recs.drop(sessionID)
	}
}

// restore is egress.Config.Restore. A ref the store no longer has leaves
// the session without its secrets (logged): its placeholders then go out
// as they are, never another value.
func (er *egressRecords) restore(sessionID string) (egress.Restored, bool) {
	er.mu.Lock()
	rec, ok := er.byID[sessionID]
	er.mu.Unlock()
	if !ok {
		return egress.Restored{}, false
	}
	var out egress.Restored
	if rec.Network != "" {
		if pol, err := rec.Network.Policy("network"); err == nil {
			out.Policy = &pol
		}
	}
	if len(rec.Secrets) > 0 {
		secrets, err := resolveSecrets(rec.Secrets, er.secretsFile())
		if err != nil {
			er.recs.log.Warn().Err(err).Str("session_id", sessionID).Msg("the session's recorded secrets cannot be restored")
		} else {
			out.Secrets, out.Identity = secrets, rec.Identity
		}
	}
	return out, true
}

// adopted returns info with the network its last update gave it; a
// record of another sandbox of the same id is stale and dropped.
func (er *egressRecords) adopted(info backends.Session) backends.Session {
	er.mu.Lock()
	rec, ok := er.byID[info.SessionID]
	er.mu.Unlock()
	switch {
	case !ok:
	case rec.BackendSessionID != info.BackendSessionID:
		er.drop(info.SessionID)
	case rec.Network != "" && info.Network.Egress():
		info.Network = rec.Network
	}
	return info
}

// retain drops the records of sessions not served after adoption: they
// ended with the boxrt that made them.
func (er *egressRecords) retain(served func(sessionID string) bool) {
	er.mu.Lock()
	var gone []string
	for id := range er.byID {
		if !served(id) {
			gone = append(gone, id)
		}
	}
	er.mu.Unlock()
	for _, id := range gone {
		er.drop(id)
	}
}
