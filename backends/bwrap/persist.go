package bwrap

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// A persistent session's sandbox outlives boxrt: it is started without
// --die-with-parent or a parent-death signal, and recorded in
// session.json (bwrap's pid and start time, the session cgroup's leaf).
// A boxrt started again on the same state directory adopts it: Adopt
// keeps its cgroup leaf and its stage (the disk mount, the network
// namespace's pin, the agent's socket directory and binary), and the
// session's first call listens again at the same socket path, where the
// agent, dialling again every second, connects. The egress proxy, which
// ended with the old boxrt, is attached again to the pinned namespace. A
// graceful Close detaches from such a sandbox instead of killing it.

// sandboxRecord is a persistent session's running sandbox.
type sandboxRecord struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // /proc/<pid>/stat starttime: a recycled pid has another
	Leaf  string `json:"cgroup_leaf,omitempty"`
}

// alive reports whether the recorded bwrap still runs.
func (rec sandboxRecord) alive() bool {
	return rec.PID > 0 && rec.Start != 0 && startTime(rec.PID) == rec.Start
}

// startTime is field 22 of /proc/<pid>/stat (0 when unreadable).
func startTime(pid int) uint64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// recordSandbox writes r into the session's session.json.
func (b *Backend) recordSandbox(dir string, r *run, sf *sessionFiles) error {
	r.mu.Lock()
	pid := r.cmd.Process.Pid
	r.mu.Unlock()
	rec := &sandboxRecord{PID: pid, Start: startTime(pid)}
	if r.cg != nil && len(r.cg.dirs) > 0 {
		rec.Leaf = filepath.Base(r.cg.dirs[0])
	}
	st, err := readState(dir)
	if err != nil {
		return err
	}
	st.Sandbox = rec
	return writeState(dir, st)
}

// adoptable records what Adopt found running, by session directory.
func (b *Backend) setAdoptable(key string, rec sandboxRecord) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.adoptable == nil {
		b.adoptable = map[string]sandboxRecord{}
	}
	b.adoptable[key] = rec
}

// takeAdoptable hands out (once) the running sandbox Adopt found for key.
func (b *Backend) takeAdoptable(key string) (sandboxRecord, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec, ok := b.adoptable[key]
	delete(b.adoptable, key)
	return rec, ok
}

// adoptStage makes an adopted sandbox's stage and cgroup the session's
// own, as they are (sf.mu held, before anything is staged).
func (sf *sessionFiles) adoptStage(b *Backend) {
	rec, ok := b.takeAdoptable(sf.key)
	if !ok || !rec.alive() {
		return
	}
	if b.id.cred != nil {
		stage := filepath.Join(stageRoot, b.cfg.InstanceID, sf.key)
		if !exists(filepath.Join(stage, agentHostDir)) {
			return
		}
		sf.stage, sf.ready = stage, true
		sf.agentStaged = exists(filepath.Join(stage, agentHostBin))
		// Its host directories stay staged as h<n>: new ones go after.
		entries, _ := os.ReadDir(stage)
		for _, e := range entries {
			if n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "h")); err == nil && strings.HasPrefix(e.Name(), "h") {
				sf.staged = max(sf.staged, n+1)
			}
		}
	}
	if cg := b.recordCgroup(rec); cg != nil {
		sf.cg = cg
	}
	sf.adopted = &rec
}

// recordCgroup is the cgroup leaf of a recorded sandbox (nil: none).
func (b *Backend) recordCgroup(rec sandboxRecord) *cgroup {
	if rec.Leaf == "" || b.cg.version == cgroupNone {
		return nil
	}
	return b.cg.existing(b.cfg.InstanceID, rec.Leaf)
}

// takeAdopted returns (once) the running sandbox the session adopted.
func (sf *sessionFiles) takeAdopted() *sandboxRecord {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	rec := sf.adopted
	sf.adopted = nil
	return rec
}

// adoptResident takes over a persistent session's sandbox left by an
// earlier boxrt: its agent dials the socket made again at the same path.
// One that does not within acceptTimeout is killed.
func (b *Backend) adoptResident(ctx context.Context, sf *sessionFiles, dir string, info backends.Session, rec sandboxRecord) (*machine, error) {
	p, err := os.FindProcess(rec.PID) // a pidfd: signals never reach a recycled pid
	if err != nil || !rec.alive() {
		return nil, fmt.Errorf("the sandbox of pid %d is gone", rec.PID)
	}
	pidfd, err := unix.PidfdOpen(rec.PID, 0)
	if err != nil || !rec.alive() {
		if err == nil {
			unix.Close(pidfd)
		}
		return nil, fmt.Errorf("the sandbox of pid %d is gone", rec.PID)
	}
	r := &run{b: b, key: info.BackendSessionID, cg: sf.cg, done: make(chan struct{}), init: -1, cmd: &exec.Cmd{Process: p}}
	if err := b.register(r, info.SessionID, dir); err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	go r.waitAdopted(pidfd)
	sockDir, _, err := sf.agentFiles(b, dir)
	res := &sf.res
	if err == nil {
		res.ln, err = sandboxagent.Listen(sockDir)
	}
	var conn *sandboxagent.Conn
	if err == nil {
		actx, cancel := context.WithTimeout(ctx, acceptTimeout)
		conn, err = res.ln.Accept(actx)
		cancel()
	}
	if err != nil {
		r.kill()
		<-r.done
		res.dropListener()
		return nil, boxerr.Failure("bwrap: cannot take over the sandbox of session %s: %v", info.SessionID, err).Wrap(err)
	}
	return &machine{r: r, conn: conn}, nil
}

// killUnadopted kills the sandbox an earlier boxrt left running for the
// session under key, when no call took it over yet (quiesce: the session
// is being stopped or suspended before its first use).
func (b *Backend) killUnadopted(key string) {
	recs := []sandboxRecord{}
	if rec, ok := b.takeAdoptable(key); ok {
		recs = append(recs, rec)
	}
	b.mu.Lock()
	sf := b.open[key]
	b.mu.Unlock()
	if sf != nil {
		if rec := sf.takeAdopted(); rec != nil {
			recs = append(recs, *rec)
		}
	}
	for _, rec := range recs {
		p, err := os.FindProcess(rec.PID)
		if err != nil || !rec.alive() {
			continue
		}
		inits := killInit(p)
		_ = p.Kill()
		awaitExit(inits, 10*time.Second)
	}
}

// waitAdopted waits for an adopted bwrap (not boxrt's child, so not
// boxrt's to reap) to exit.
func (r *run) waitAdopted(pidfd int) {
	awaitPidfd(pidfd)
	r.b.unregister(r)
	close(r.done)
}
