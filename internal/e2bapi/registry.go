package e2bapi

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// sandbox is the E2B view of one session. Its fields after mu are guarded
// by mu; the others never change.
type sandbox struct {
	physical  string
	logical   string
	placement tenant.Placement
	scoped    bool
	token     string
	template  string
	started   time.Time
	// box is the session's sandbox, which every exec's spec repeats (the
	// runtime refuses a spec that differs from its session's); its
	// network changes with updates, under mu.
	box      backends.Sandbox
	envs     map[string]string
	metadata map[string]string
	// autoPause: the timeout pauses the sandbox instead of killing it.
	autoPause bool

	mu      sync.Mutex
	endAt   time.Time
	timer   *time.Timer
	nextPID uint32
	procs   map[uint32]*command
	// watchers are the polled watches (CreateWatcher) by id.
	watchers map[string]*watcher
}

// command is one process the SDK started, by the pid it was given.
type command struct {
	execID string
	config *process.ProcessConfig
	tag    string
}

// maxCommands bounds the commands a sandbox remembers; the oldest ended
// ones are forgotten first (the runtime forgets their execs too).
const maxCommands = 4096

func (s *sandbox) addCommand(execID string, cfg *process.ProcessConfig, tag string) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextPID++
	if len(s.procs) >= maxCommands {
		for pid := range s.procs {
			if pid < s.nextPID-maxCommands/2 {
				delete(s.procs, pid)
			}
		}
	}
	s.procs[s.nextPID] = &command{execID: execID, config: cfg, tag: tag}
	return s.nextPID
}

// lookup finds a command by pid or tag.
func (s *sandbox) lookup(sel *process.ProcessSelector) (uint32, *command, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		c, ok := s.procs[v.Pid]
		return v.Pid, c, ok
	case *process.ProcessSelector_Tag:
		for pid, c := range s.procs {
			if c.tag != "" && c.tag == v.Tag {
				return pid, c, true
			}
		}
	}
	return 0, nil, false
}

// commands returns the known commands by pid.
func (s *sandbox) commands() map[uint32]*command {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint32]*command, len(s.procs))
	for pid, c := range s.procs {
		out[pid] = c
	}
	return out
}

func (s *sandbox) deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endAt
}

// registry holds the sandboxes by physical session id, and keeps their
// records in store.
type registry struct {
	store recordStore
	// warn reports a record that could not be written or removed.
	warn func(error)

	mu     sync.Mutex
	byID   map[string]*sandbox
	closed bool
}

func newRegistry(store recordStore, warn func(error)) *registry {
	return &registry{store: store, warn: warn, byID: map[string]*sandbox{}}
}

// persist writes sb's record.
func (r *registry) persist(sb *sandbox) {
	if err := r.store.save(sb); err != nil {
		r.warn(fmt.Errorf("e2b: the record of sandbox %s could not be written: %w", sb.logical, err))
	}
}

func (r *registry) get(physical string) *sandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[physical]
}

// find returns the sandbox of logical id whose access token is token
// (ids of different namespaces may be equal: the token tells them apart),
// and whether any sandbox has that id.
func (r *registry) find(id, token string) (_ *sandbox, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.byID {
		if s.logical != id {
			continue
		}
		known = true
		if token != "" && equal(token, s.token) {
			return s, true
		}
	}
	return nil, known
}

// put adds s unless a sandbox of that id is there already, and returns
// the one kept.
func (r *registry) put(s *sandbox) *sandbox {
	r.mu.Lock()
	if old := r.byID[s.physical]; old != nil {
		r.mu.Unlock()
		return old
	}
	r.byID[s.physical] = s
	r.mu.Unlock()
	r.persist(s)
	return s
}

func (r *registry) remove(physical string) {
	r.mu.Lock()
	s := r.byID[physical]
	delete(r.byID, physical)
	r.mu.Unlock()
	if err := r.store.remove(physical); err != nil {
		r.warn(fmt.Errorf("e2b: the record of sandbox %s could not be removed: %w", physical, err))
	}
	if s != nil {
		s.mu.Lock()
		if s.timer != nil {
			s.timer.Stop()
		}
		s.mu.Unlock()
		s.stopWatchers()
	}
}

// retain forgets the sandboxes whose session is no longer live (deleted
// through another API or reaped).
func (r *registry) retain(live map[string]bool) {
	r.mu.Lock()
	var gone []string
	for id := range r.byID {
		if !live[id] {
			gone = append(gone, id)
		}
	}
	r.mu.Unlock()
	for _, id := range gone {
		r.remove(id)
	}
}

// close stops every timer and watcher; no sandbox expires after it.
func (r *registry) close() {
	r.mu.Lock()
	r.closed = true
	all := make([]*sandbox, 0, len(r.byID))
	for _, s := range r.byID {
		s.mu.Lock()
		if s.timer != nil {
			s.timer.Stop()
		}
		s.mu.Unlock()
		all = append(all, s)
	}
	r.mu.Unlock()
	for _, s := range all {
		s.stopWatchers()
	}
}

// setTimeout makes s end d from now, calling expire then.
// setNetwork records the session's network after an update: every
// exec's spec repeats it.
func (r *registry) setNetwork(s *sandbox, mode backends.NetworkMode) {
	s.mu.Lock()
	s.box.Network = mode
	s.mu.Unlock()
	r.persist(s)
}

// sandboxSpec is the session's sandbox as execs repeat it.
func (s *sandbox) sandboxSpec() backends.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.box
}

func (r *registry) setTimeout(s *sandbox, d time.Duration, now time.Time, expire func()) {
	r.arm(s, now.Add(d), d, expire)
	r.persist(s)
}

// arm sets s's end to endAt and its timer to fire after d.
func (r *registry) arm(s *sandbox, endAt time.Time, d time.Duration, expire func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endAt = endAt
	if s.timer != nil {
		s.timer.Stop()
	}
	if !r.closed {
		s.timer = time.AfterFunc(d, expire)
	}
}

// stopTimer cancels s's timeout: a paused sandbox does not expire (a
// resume sets a new one).
func (r *registry) stopTimer(s *sandbox) {
	s.mu.Lock()
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.endAt = time.Time{}
	s.mu.Unlock()
	r.persist(s)
}

// restoreGrace is the least time a sandbox whose timeout passed while
// boxrt was down gets after a restart: the runtime adopts its sessions
// first, so the timeout finds it and ends it.
const restoreGrace = 10 * time.Second

// restore reads the stored records back, with their timeouts running
// again (expire makes each one's timeout action).
func (r *registry) restore(expire func(*sandbox) func()) {
	recs, problems := r.store.load()
	for _, err := range problems {
		r.warn(err)
	}
	now := time.Now()
	for _, rec := range recs {
		sb := sandboxOfRecord(rec)
		r.mu.Lock()
		r.byID[sb.physical] = sb
		r.mu.Unlock()
		if !sb.endAt.IsZero() {
			r.arm(sb, sb.endAt, max(sb.endAt.Sub(now), restoreGrace), expire(sb))
		}
	}
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
