package runtime

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/clip"
)

// DefaultProcessID is the process id a spec without one gets.
const DefaultProcessID = "default"

// Process states on the wire.
const (
	ProcessRunning = "running"
	ProcessExited  = "exited"
)

// stopGrace is how long a process has between SIGTERM and SIGKILL.
var stopGrace = 5 * time.Second

// ProcessInfo is the reference BoxManagedProcessInfo.
type ProcessInfo struct {
	SessionID     string     `json:"session_id"`
	ProcessID     string     `json:"process_id"`
	Status        string     `json:"status"`
	Command       string     `json:"command"`
	Args          []string   `json:"args"`
	Cwd           string     `json:"cwd"`
	EnvKeys       []string   `json:"env_keys"`
	Attached      bool       `json:"attached"`
	StartedAt     time.Time  `json:"started_at"`
	ExitedAt      *time.Time `json:"exited_at"`
	ExitCode      *int       `json:"exit_code"`
	StderrPreview string     `json:"stderr_preview"`
	// PendingLines is how many stdout lines wait for the next attacher.
	PendingLines int `json:"pending_lines"`
	// RelayToken opens the relay of this process only (this session, this
	// process id, this start: a replacement gets a new one). Hosts hand it
	// to the MCP client instead of the control token.
	RelayToken string `json:"relay_token"`
	// Resumed is true for a process started again by a session resume: the
	// relay replays nothing from before the suspension (that output is
	// gone), only what the new process writes.
	Resumed bool `json:"resumed,omitempty"`
}

type managedProcess struct {
	sessionID string
	spec      backends.ProcessSpec
	proc      backends.Process
	startedAt time.Time
	stdout    *lineHub
	stderr    *stderrPreview
	done      chan struct{}
	// relayToken is the credential for this process's relay alone.
	relayToken string
	// stdinSlot holds one token while a relay writes to stdin.
	stdinSlot chan struct{}
	// touch marks the session used; relay traffic calls it per line, so it
	// is throttled rather than taking the session table's lock every time.
	touch func()
	// resumed: started again by a session resume; the output it gave
	// before the suspension is gone.
	resumed bool

	mu       sync.Mutex
	exitedAt time.Time
	exitCode *int
}

func (p *managedProcess) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *managedProcess) info() ProcessInfo {
	keys := make([]string, 0, len(p.spec.Env))
	for k := range p.spec.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := p.spec.Args
	if args == nil {
		args = []string{}
	}
	pi := ProcessInfo{
		SessionID: p.sessionID, ProcessID: p.spec.ProcessID, Status: ProcessRunning,
		Command: p.spec.Command, Args: args, Cwd: p.spec.Cwd, EnvKeys: keys,
		Attached: p.stdout.attached(), StartedAt: p.startedAt.UTC(),
		StderrPreview: p.stderr.String(), PendingLines: p.stdout.pending(),
		RelayToken: p.relayToken, Resumed: p.resumed,
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exitCode != nil {
		pi.Status = ProcessExited
		at := p.exitedAt.UTC()
		code := *p.exitCode
		pi.ExitedAt, pi.ExitCode = &at, &code
	}
	return pi
}

// Processes is the managed-process service. It owns the process table
// and the budget of unfinished stdout lines all processes share.
type Processes struct {
	r     *Runtime
	table processTable
	// lineBudget is shared by every managed process's unfinished stdout
	// line.
	lineBudget *lineBudget
}

func newProcesses(r *Runtime) *Processes {
	return &Processes{r: r, table: processTable{bySession: map[*session]map[string]*managedProcess{}},
		lineBudget: newLineBudget(func() int { return r.Config().Limits.RelayLineBufferBytes })}
}

// processTable holds the managed processes of every session, by session
// and process id, with the starts under way: a start's capacity check and
// its reservation are one step, so starts on different sessions cannot
// both pass.
type processTable struct {
	mu        sync.Mutex
	bySession map[*session]map[string]*managedProcess
	// starting counts the starts between their capacity check and their
	// entry in the table.
	starting int
}

// reserve holds a place under limit for a process about to start; starts
// in progress count with the running processes (the reference's rule).
func (t *processTable) reserve(limit int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.runningLocked()+t.starting >= limit {
		return boxerr.CapacityExceeded("max_managed_processes", limit, "Box managed process capacity reached (%d)", limit)
	}
	t.starting++
	return nil
}

func (t *processTable) unreserve() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.starting--
}

// put turns a reservation into p, running in s.
func (t *processTable) put(s *session, p *managedProcess) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bySession[s] == nil {
		t.bySession[s] = map[string]*managedProcess{}
	}
	t.bySession[s][p.spec.ProcessID] = p
	t.starting--
}

// take removes process id of s from the table and returns it.
func (t *processTable) take(s *session, id string) *managedProcess {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.bySession[s][id]
	t.deleteLocked(s, id)
	return p
}

func (t *processTable) deleteLocked(s *session, id string) {
	delete(t.bySession[s], id)
	if len(t.bySession[s]) == 0 {
		delete(t.bySession, s)
	}
}

// takeSession removes every process of s (every process, with nil).
func (t *processTable) takeSession(s *session) []*managedProcess {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*managedProcess
	for owner, procs := range t.bySession {
		if s != nil && owner != s {
			continue
		}
		for id, p := range procs {
			out = append(out, p)
			t.deleteLocked(owner, id)
		}
	}
	return out
}

func (t *processTable) get(s *session, id string) (*managedProcess, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.bySession[s][id]
	return p, ok
}

// infos describes the processes of s, running and exited.
func (t *processTable) infos(s *session) map[string]ProcessInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.bySession[s]) == 0 {
		return nil
	}
	out := map[string]ProcessInfo{}
	for id, p := range t.bySession[s] {
		out[id] = p.info()
	}
	return out
}

// running counts the running processes of every session.
func (t *processTable) running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.runningLocked()
}

func (t *processTable) runningLocked() int {
	n := 0
	for s := range t.bySession {
		n += t.runningInLocked(s)
	}
	return n
}

// runningIn counts the running processes of s.
func (t *processTable) runningIn(s *session) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.runningInLocked(s)
}

func (t *processTable) runningInLocked(s *session) int {
	n := 0
	for _, p := range t.bySession[s] {
		if p.running() {
			n++
		}
	}
	return n
}

// runningSpecs returns the specs of the running processes of s.
func (t *processTable) runningSpecs(s *session) []backends.ProcessSpec {
	t.mu.Lock()
	defer t.mu.Unlock()
	var specs []backends.ProcessSpec
	for _, p := range t.bySession[s] {
		if p.running() {
			specs = append(specs, p.spec)
		}
	}
	return specs
}

// purge drops exit records older than retention and beyond max, oldest
// first.
func (t *processTable) purge(retention time.Duration, max int, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	type rec struct {
		s  *session
		id string
		at time.Time
	}
	var kept []rec
	for s, procs := range t.bySession {
		for id, p := range procs {
			p.mu.Lock()
			exited, at := p.exitCode != nil, p.exitedAt
			p.mu.Unlock()
			if !exited {
				continue
			}
			if now.Sub(at) >= retention {
				t.deleteLocked(s, id)
				continue
			}
			kept = append(kept, rec{s, id, at})
		}
	}
	if excess := len(kept) - max; excess > 0 {
		sort.Slice(kept, func(i, j int) bool { return kept[i].at.Before(kept[j].at) })
		for _, k := range kept[:excess] {
			t.deleteLocked(k.s, k.id)
		}
	}
}

// NormalizeProcessSpec applies the reference defaults and validation.
func NormalizeProcessSpec(spec *backends.ProcessSpec) error {
	spec.Command = strings.TrimSpace(spec.Command)
	spec.Cwd = strings.TrimSpace(spec.Cwd)
	if spec.ProcessID == "" {
		spec.ProcessID = DefaultProcessID
	}
	if spec.Cwd == "" {
		spec.Cwd = backends.DefaultMountPath
	}
	switch {
	case spec.Command == "":
		return boxerr.Validation("spec.command", "spec.command must not be empty")
	case !strings.HasPrefix(spec.Cwd, "/"):
		return boxerr.Validation("spec.cwd", "spec.cwd must be absolute, got %q", spec.Cwd)
	case spec.MemoryMB < 0 || spec.MemoryMB > backends.MaxProcessMemoryMB:
		return boxerr.Validation("spec.memory_mb", "spec.memory_mb must be between 0 and %d, got %d", backends.MaxProcessMemoryMB, spec.MemoryMB)
	}
	if err := checkProcessID("spec.process_id", spec.ProcessID); err != nil {
		return err
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return boxerr.Validation("spec.env", "env name %q is invalid", k)
		}
	}
	return nil
}

// checkProcessID refuses ids that cannot name a process safely: the id is a
// path segment of the relay URL and of backend state, so "." and ".."
// would address something else, and blank or padded ids would not survive
// the trimming every other id gets.
func checkProcessID(field, id string) error {
	switch {
	case id == "." || id == "..":
		return boxerr.Validation(field, "%s must not be %q", field, id)
	case strings.TrimSpace(id) != id || id == "":
		return boxerr.Validation(field, "%s must not be blank or start or end with white space, got %q", field, id)
	case len(id) > 128 || strings.ContainsAny(id, "/\x00"):
		return boxerr.Validation(field, "%s must be at most 128 bytes without '/' or NUL", field)
	}
	return nil
}

// Start starts a managed process in an existing session, replacing a
// running one with the same id. The process outlives the request and any
// connection; only a stop, its session's destruction or boxrt's exit end
// it.
func (ps *Processes) Start(ctx context.Context, sessionID string, spec backends.ProcessSpec) (ProcessInfo, error) {
	if err := NormalizeProcessSpec(&spec); err != nil {
		return ProcessInfo{}, err
	}
	r := ps.r
	named := sessionID
	sessionID, err := resolve(ctx, sessionID)
	if err != nil {
		return ProcessInfo{}, err
	}
	ps.purgeExitRecords()
	for {
		s, err := r.sessions.live(sessionID)
		if err != nil {
			return ProcessInfo{}, noSessionForProcess(named, err)
		}
		b := r.backends.current()
		if r.sessions.info(s).State == backends.StateSuspended {
			if _, err := r.resumeSession(ctx, sessionID); err != nil {
				return ProcessInfo{}, err
			}
		}
		s.op.Lock()
		if r.sessions.info(s).State == backends.StateSuspended { // suspended again before the start: resume again
			s.op.Unlock()
			continue
		}
		pi, err := ps.start(ctx, b, s, spec, false)
		s.op.Unlock()
		return pi, err
	}
}

// start starts spec in s, whose op lock the caller holds. resumed marks a
// process brought back by a resume.
func (ps *Processes) start(ctx context.Context, b backends.Backend, s *session, spec backends.ProcessSpec, resumed bool) (ProcessInfo, error) {
	r := ps.r
	sessionID := s.info.SessionID
	if old := ps.table.take(s, spec.ProcessID); old != nil {
		ps.terminate(ctx, old)
		r.counters.processesReplaced.Add(1)
	}
	if r.sessions.isDeleting(s) {
		return ProcessInfo{}, boxerr.SessionNotFound(sessionID)
	}
	if !r.life.enter(&r.inflight) {
		return ProcessInfo{}, errShuttingDown()
	}
	defer r.inflight.Done()
	limits := r.Config().Limits
	if err := ps.table.reserve(limits.MaxManagedProcesses); err != nil {
		return ProcessInfo{}, err
	}
	p, err := ps.launch(ctx, b, s, spec, resumed, limits)
	if err != nil {
		ps.table.unreserve()
		return ProcessInfo{}, err
	}
	ps.table.put(s, p) // the reservation is now a running process
	r.sessions.touch(sessionID)
	r.counters.processesStarted.Add(1)
	r.log.Info().Str("session_id", sessionID).Str("process_id", spec.ProcessID).
		Str("command", clip.String(spec.Command, 200)).Strs("env_keys", p.info().EnvKeys).Msg("managed process started")
	return p.info(), nil
}

// launch starts spec's process through b and the goroutines that drain
// its output and record its exit.
func (ps *Processes) launch(ctx context.Context, b backends.Backend, s *session, spec backends.ProcessSpec, resumed bool, limits Limits) (*managedProcess, error) {
	r := ps.r
	sessionID := s.info.SessionID
	relayToken, err := newRelayToken()
	if err != nil {
		return nil, err
	}
	proc, err := b.StartProcess(context.WithoutCancel(ctx), r.sessions.sandboxInfo(s), spec)
	if err != nil {
		return nil, err
	}
	touch := r.sessions.throttledTouch(sessionID)
	onDrop := func(overBudget bool) {
		r.log.Warn().Str("session_id", sessionID).Str("process_id", spec.ProcessID).Bool("over_budget", overBudget).
			Msg("stdout line dropped unfinished")
	}
	p := &managedProcess{
		sessionID:  sessionID,
		spec:       spec,
		proc:       proc,
		startedAt:  r.clock.Now(),
		stdout:     newLineHub(limits.RelayReplayLines, limits.RelayReplayBytes, ps.lineBudget, touch, onDrop),
		stderr:     newStderrPreview(4000),
		done:       make(chan struct{}),
		touch:      touch,
		relayToken: relayToken,
		stdinSlot:  make(chan struct{}, 1),
		resumed:    resumed,
	}
	var drained sync.WaitGroup
	drained.Add(2)
	go func() { defer drained.Done(); p.stdout.pump(proc.Stdout()) }()
	go func() { defer drained.Done(); _, _ = io.Copy(p.stderr, proc.Stderr()) }()
	go ps.watch(p, &drained)
	return p, nil
}

// newRelayToken returns 32 random bytes, base64url: unguessable, and safe
// in a header or a WebSocket subprotocol.
func newRelayToken() (string, error) {
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return "", boxerr.Failure("cannot generate a relay token: %v", err).Wrap(err)
	}
	return base64.RawURLEncoding.EncodeToString(buf), nil
}

// watch records the exit of p once its output is drained.
func (ps *Processes) watch(p *managedProcess, drained *sync.WaitGroup) {
	r := ps.r
	code, err := p.proc.Wait()
	drained.Wait()
	now := r.clock.Now()
	p.mu.Lock()
	p.exitedAt, p.exitCode = now, &code
	p.mu.Unlock()
	// The exit is session activity; it is recorded before done closes so a
	// caller that waited for the exit (Stop) never sees a later touch move
	// the session's last use.
	r.sessions.touch(p.sessionID)
	close(p.done)
	r.counters.processesExited.Add(1)
	r.events.publish(p.sessionID, EventProcessExited, map[string]any{"process_id": p.spec.ProcessID, "exit_code": code})
	r.log.Info().Str("session_id", p.sessionID).Str("process_id", p.spec.ProcessID).Int("exit_code", code).
		AnErr("wait_error", err).Msg("managed process exited")
	ps.purgeExitRecords()
}

// terminate stops p's whole process tree: close stdin, SIGTERM, then
// SIGKILL after the grace period.
func (ps *Processes) terminate(ctx context.Context, p *managedProcess) {
	if !p.running() {
		return
	}
	_ = p.proc.Stdin().Close()
	_ = p.proc.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-p.done:
		return
	case <-t.C:
	case <-ctx.Done():
	}
	_ = p.proc.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		ps.r.log.Warn().Str("session_id", p.sessionID).Str("process_id", p.spec.ProcessID).Msg("managed process did not exit after SIGKILL")
	}
}

// Get returns a managed process's info.
func (ps *Processes) Get(ctx context.Context, sessionID, processID string) (ProcessInfo, error) {
	p, err := ps.lookup(ctx, sessionID, processID)
	if err != nil {
		return ProcessInfo{}, err
	}
	return p.info(), nil
}

// lookup finds a process of a session of ctx's namespace.
func (ps *Processes) lookup(ctx context.Context, sessionID, processID string) (*managedProcess, error) {
	if processID == "" {
		processID = DefaultProcessID
	}
	if err := checkProcessID("process_id", processID); err != nil {
		return nil, err
	}
	sessionID, err := resolve(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	s, err := ps.awake(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	p, ok := ps.table.get(s, processID)
	if !ok {
		return nil, boxerr.ProcessNotFound(sessionID, processID)
	}
	return p, nil
}

// awake is session id, resumed first when it is suspended: a suspended
// session's managed processes still exist for the host (they run again
// when it resumes), so reading, attaching to or stopping one resumes it,
// as every call that needs a suspended session does.
func (ps *Processes) awake(ctx context.Context, id string) (*session, error) {
	r := ps.r
	s := r.sessions.get(id)
	if s == nil {
		return nil, boxerr.SessionNotFound(id)
	}
	if r.sessions.info(s).State == backends.StateSuspended {
		if _, err := r.resumeSession(ctx, id); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// noSessionForProcess words a missing session for box_start_managed_process,
// which never creates one: the host has to make it first.
func noSessionForProcess(named string, err error) error {
	if !errors.Is(err, boxerr.ErrSessionNotFound) {
		return err
	}
	e := boxerr.SessionNotFound(named)
	e.Msg += "; a managed process needs a session: create it with box_create_session (or box_exec) first"
	return e
}

// Stop terminates a managed process and forgets it.
func (ps *Processes) Stop(ctx context.Context, sessionID, processID string) error {
	if processID == "" {
		processID = DefaultProcessID
	}
	if err := checkProcessID("process_id", processID); err != nil {
		return err
	}
	sessionID, err := resolve(ctx, sessionID)
	if err != nil {
		return err
	}
	s, err := ps.awake(ctx, sessionID)
	if err != nil {
		return err
	}
	s.op.Lock()
	defer s.op.Unlock()
	p := ps.table.take(s, processID)
	if p == nil {
		return boxerr.ProcessNotFound(sessionID, processID)
	}
	ps.terminate(context.WithoutCancel(ctx), p)
	ps.r.sessions.touch(sessionID)
	ps.r.log.Info().Str("session_id", sessionID).Str("process_id", processID).Msg("managed process stopped")
	return nil
}

// CheckAttach reports whether Attach would succeed, without taking the
// process over: BoxSessionNotFoundError, BoxManagedProcessNotFoundError, or
// BoxManagedProcessConflictError when the process has exited and has
// nothing left to deliver.
func (ps *Processes) CheckAttach(ctx context.Context, sessionID, processID string) error {
	_, err := ps.attachable(ctx, sessionID, processID)
	return err
}

func (ps *Processes) attachable(ctx context.Context, sessionID, processID string) (*managedProcess, error) {
	p, err := ps.lookup(ctx, sessionID, processID)
	if err != nil {
		return nil, err
	}
	if !p.running() && p.stdout.pending() == 0 {
		return nil, boxerr.ProcessConflict(sessionID, p.spec.ProcessID,
			"managed process %s in session %s is not running", p.spec.ProcessID, sessionID)
	}
	return p, nil
}

// Attach attaches a relay to a managed process's stdout, taking over from
// the current attacher.
func (ps *Processes) Attach(ctx context.Context, sessionID, processID string) (*Attachment, *ProcessHandle, error) {
	p, err := ps.attachable(ctx, sessionID, processID)
	if err != nil {
		return nil, nil, err
	}
	ps.r.sessions.touch(p.sessionID)
	return p.stdout.attach(), &ProcessHandle{p: p}, nil
}

// ProcessHandle lets a relay write to a process and learn how it ended.
type ProcessHandle struct{ p *managedProcess }

// deadlineWriter is a stdin that can bound a blocked write: an os.File
// pipe (bwrap) or the engine connection (docker).
type deadlineWriter interface {
	SetWriteDeadline(time.Time) error
}

// Write writes one message to the process's stdin; it counts as session
// activity. A process that stops reading fills its pipe and would block
// the write forever: the write gives up at ctx's deadline or when ctx ends
// (the relay socket went away), as far as the stdin can bound a write.
// Writers are serialised, so a socket taking over never interleaves its
// bytes with the previous socket's last message.
func (h *ProcessHandle) Write(ctx context.Context, b []byte) error {
	p := h.p
	select {
	case p.stdinSlot <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.stdinSlot }()
	defer p.touch()
	w := p.proc.Stdin()
	dw, ok := w.(deadlineWriter)
	if !ok {
		_, err := w.Write(b)
		return err
	}
	deadline, _ := ctx.Deadline() // zero: none
	if err := dw.SetWriteDeadline(deadline); err != nil {
		_, err := w.Write(b)
		return err
	}
	aborted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = dw.SetWriteDeadline(time.Unix(1, 0))
		close(aborted)
	})
	_, err := w.Write(b)
	if !stop() {
		<-aborted // its past deadline must not outlive this write
	}
	_ = dw.SetWriteDeadline(time.Time{})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// Done is closed when the process has exited and its output is drained.
func (h *ProcessHandle) Done() <-chan struct{} { return h.p.done }

// ExitCode is valid after Done.
func (h *ProcessHandle) ExitCode() int {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	if h.p.exitCode == nil {
		return -1
	}
	return *h.p.exitCode
}

// stopSession terminates every process of s, in parallel.
func (ps *Processes) stopSession(ctx context.Context, s *session) {
	ps.terminateAll(ctx, ps.table.takeSession(s))
}

// stopAll terminates every managed process (at exit).
func (ps *Processes) stopAll(ctx context.Context) {
	ps.terminateAll(ctx, ps.table.takeSession(nil))
}

func (ps *Processes) terminateAll(ctx context.Context, procs []*managedProcess) {
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); ps.terminate(ctx, p) }()
	}
	wg.Wait()
}

// purgeExitRecords drops exit records older than the retention and beyond
// max_completed_processes, oldest first.
func (ps *Processes) purgeExitRecords() {
	limits := ps.r.Config().Limits
	ps.table.purge(time.Duration(limits.CompletedProcessRetentionSec)*time.Second, limits.MaxCompletedProcesses, ps.r.clock.Now())
}

// stderrPreview keeps the last whole lines of stderr within max characters.
type stderrPreview struct {
	mu      sync.Mutex
	max     int
	lines   []string
	size    int
	partial strings.Builder
}

func newStderrPreview(max int) *stderrPreview { return &stderrPreview{max: max} }

func (s *stderrPreview) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	text := strings.ToValidUTF8(string(p), "\uFFFD")
	for {
		i := strings.IndexByte(text, '\n')
		if i < 0 {
			s.partial.WriteString(text)
			if s.partial.Len() > s.max { // a runaway line: keep its end
				tail := s.partial.String()
				s.partial.Reset()
				s.partial.WriteString(tail[len(tail)-s.max:])
			}
			return len(p), nil
		}
		s.partial.WriteString(text[:i])
		s.push(strings.TrimRight(s.partial.String(), " \t\r"))
		s.partial.Reset()
		text = text[i+1:]
	}
}

func (s *stderrPreview) push(line string) {
	if line == "" {
		return
	}
	if len(line) > s.max {
		line = line[len(line)-s.max:]
	}
	s.lines = append(s.lines, line)
	s.size += len(line) + 1
	for s.size > s.max && len(s.lines) > 0 {
		s.size -= len(s.lines[0]) + 1
		s.lines = s.lines[1:]
	}
}

func (s *stderrPreview) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := strings.Join(s.lines, "\n")
	if p := strings.TrimSpace(s.partial.String()); p != "" {
		if out != "" {
			out += "\n"
		}
		out += p
	}
	if len(out) > s.max {
		out = out[len(out)-s.max:]
	}
	return out
}
