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

// networkRecord is the policy box_update_network last gave a session.
type networkRecord struct {
	SessionID        string               `json:"session_id"`
	BackendSessionID string               `json:"backend_session_id"`
	Network          backends.NetworkMode `json:"network"`
}

// networkUpdates keeps the policies box_update_network gave sessions so
// that they outlive boxrt: a backend re-attaching a sandbox it adopts
// knows only the policy the session was created with, so the proxy asks
// here first (egress.Config.PolicyOverride) and adopt corrects the
// session's info. Records live in <state dir>/network/ (keyed by the
// physical session id) and are all read at start.
type networkUpdates struct {
	recs sessionRecords
	mu   sync.Mutex
	byID map[string]networkRecord
}

func loadNetworkUpdates(dir string, log zerolog.Logger) *networkUpdates {
	u := &networkUpdates{recs: sessionRecords{dir: dir, log: log}, byID: map[string]networkRecord{}}
	entries, _ := os.ReadDir(dir) // none yet: nothing updated
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		var rec networkRecord
		if err != nil || json.Unmarshal(data, &rec) != nil || u.recs.path(rec.SessionID) != path {
			// A temp file a crash left, or damage: the session keeps the
			// policy it was created with.
			log.Warn().Str("file", path).Msg("ignoring an unreadable network update record")
			continue
		}
		u.byID[rec.SessionID] = rec
	}
	return u
}

// set records rec before anything uses it: a policy that is in force must
// also be the one a restart finds.
func (u *networkUpdates) set(rec networkRecord) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.recs.write(rec.SessionID, rec); err != nil {
		return err
	}
	u.byID[rec.SessionID] = rec
	return nil
}

// drop forgets the session's update (deleted, or a new session of its id).
func (u *networkUpdates) drop(sessionID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.byID[sessionID]; ok {
		delete(u.byID, sessionID)
		u.recs.drop(sessionID)
	}
}

// policy is egress.Config.PolicyOverride.
func (u *networkUpdates) policy(sessionID string) (egress.Policy, bool) {
	u.mu.Lock()
	rec, ok := u.byID[sessionID]
	u.mu.Unlock()
	if !ok {
		return egress.Policy{}, false
	}
	pol, err := rec.Network.Policy("network")
	return pol, err == nil
}

// adopted returns info with the network its last update gave it; a
// record of another sandbox of the same id is stale and dropped.
func (u *networkUpdates) adopted(info backends.Session) backends.Session {
	u.mu.Lock()
	rec, ok := u.byID[info.SessionID]
	u.mu.Unlock()
	switch {
	case !ok:
	case rec.BackendSessionID != info.BackendSessionID || !info.Network.Egress():
		u.drop(info.SessionID)
	default:
		info.Network = rec.Network
	}
	return info
}
