package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Limits of live execs (docs/operations.md, "Live commands").
const (
	// MaxBackgroundExecs is how many background execs one session may run
	// at a time.
	MaxBackgroundExecs = 16
	// FinishedExecReplayBytes is what a finished background exec keeps of
	// its replay log (the newest chunks) for a late box_exec_attach; its
	// result keeps the head and tail box_exec_wait returns.
	FinishedExecReplayBytes = 64 << 10
	// ExecKillGrace is how long box_exec_kill with a signal other than
	// KILL lets the command end on its own before killing its tree.
	ExecKillGrace = 5 * time.Second
	// DefaultBackgroundTimeoutSec is a background exec's timeout_sec when
	// the caller gives none.
	DefaultBackgroundTimeoutSec = 3600
)

// Statuses of live execs, next to StatusCompleted and StatusTimedOut.
const (
	StatusRunning = "running"
	// StatusCanceled: a host stopped the command ($/cancelRequest of its
	// box_exec, box_exec_kill, shutdown); its tree was killed and the
	// session kept.
	StatusCanceled = "canceled"
)

// errCanceled is the cause of an exec a host stopped.
var errCanceled = errors.New("exec stopped by request")

// ExecOptions are what an exec asks for beyond a plain box_exec.
type ExecOptions struct {
	// Stdin keeps the command's stdin open for WriteStdin (otherwise it
	// is empty).
	Stdin bool
	// PTY runs the command on a terminal of this size.
	PTY *backends.TTYSize
	// Sink receives the output from its first byte, losslessly: the
	// command waits while Sink is behind by more than ExecReplayBytes.
	// For box_exec the result is returned only after Sink got everything.
	Sink ChunkSink
}

func (o ExecOptions) live() bool { return o.Stdin || o.PTY != nil || o.Sink != nil }

// ExecInfo describes a live exec (box_exec_start, box_exec_list).
type ExecInfo struct {
	ExecID     string     `json:"exec_id"`
	SessionID  string     `json:"session_id"`
	Cmd        string     `json:"cmd"`
	Status     string     `json:"status"`
	Background bool       `json:"background"`
	PTY        bool       `json:"pty"`
	Stdin      bool       `json:"stdin"`
	StartedAt  time.Time  `json:"started_at"`
	EndedAt    *time.Time `json:"ended_at,omitempty"`
	ExitCode   *int       `json:"exit_code"`
	// NextSeq is the seq the next output chunk will have.
	NextSeq int64 `json:"next_seq"`
	// SessionCreated: the box_exec_start that began this exec created the
	// session (first use, or its sandbox was found gone).
	SessionCreated bool `json:"session_created"`
}

// liveExec is one exec a host can reach by id while it runs: streamed,
// in the background, with stdin or a terminal.
type liveExec struct {
	id, sessionID, cmd string
	s                  *session
	background         bool
	tty                *backends.TTYSize
	started            time.Time // on the runtime's clock, for the wire
	t0                 time.Time // monotonic, for durations
	out                *execOutput
	chunkers           [2]*chunker
	stdout, stderr     *lockedHeadTail
	cancel             context.CancelCauseFunc
	resize             chan backends.Resize
	signals            chan syscall.Signal
	done               chan struct{}
	// sessionCreated: the call that started it created the session.
	sessionCreated bool

	stdinMu     sync.Mutex
	stdinR      *io.PipeReader // nil without stdin
	stdinW      *io.PipeWriter
	stdinClosed bool

	// Set before done is closed.
	result ExecResult
	err    error
	ended  time.Time
	kept   int64 // bytes kept once finished (execTable.finishedBytes)
}

func newExecID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "x-" + hex.EncodeToString(b[:])
}

func newLiveExec(ctx context.Context, s *session, spec Spec, opts ExecOptions, background bool, limit int, now time.Time) (*liveExec, context.Context) {
	ctx, cancel := context.WithCancelCause(ctx)
	x := &liveExec{
		id: newExecID(), sessionID: spec.SessionID, cmd: spec.Cmd, s: s, background: background, tty: opts.PTY,
		started: now, t0: time.Now(), cancel: cancel, resize: make(chan backends.Resize), signals: make(chan syscall.Signal),
		done:   make(chan struct{}),
		stdout: &lockedHeadTail{h: newHeadTail(limit)}, stderr: &lockedHeadTail{h: newHeadTail(limit)},
	}
	x.out = newExecOutput(x.id, ExecReplayBytes, ctx.Done())
	x.chunkers = [2]*chunker{{out: x.out, stream: StreamStdout}, {out: x.out, stream: StreamStderr}}
	if opts.Stdin {
		x.stdinR, x.stdinW = io.Pipe()
	}
	return x, ctx
}

// wire gives the backend request the exec's writers and controls.
func (x *liveExec) wire(req *backends.ExecRequest) {
	req.Stdout = io.MultiWriter(x.stdout, x.chunkers[0])
	req.Stderr = io.MultiWriter(x.stderr, x.chunkers[1])
	if x.stdinR != nil {
		req.Stdin = x.stdinR
	}
	req.TTY, req.Resize, req.Signals = x.tty, x.resize, x.signals
}

// endOutput sends the output still coalescing and closes the chunk log.
func (x *liveExec) endOutput() {
	x.chunkers[0].close()
	x.chunkers[1].close()
	x.out.close()
}

// follow feeds sink from fromSeq on its own goroutine; the returned
// channel is closed when it is done.
func (x *liveExec) follow(fromSeq int64, sink ChunkSink) (Replay, <-chan struct{}) {
	sub, rep := x.out.subscribe(fromSeq)
	done := make(chan struct{})
	go func() {
		defer close(done)
		x.out.follow(sub, sink, nil)
	}()
	return rep, done
}

func (x *liveExec) info() ExecInfo {
	x.out.mu.Lock()
	next := x.out.next
	x.out.mu.Unlock()
	in := ExecInfo{ExecID: x.id, SessionID: x.sessionID, Cmd: x.cmd, Status: StatusRunning, Background: x.background,
		PTY: x.tty != nil, Stdin: x.stdinR != nil, StartedAt: x.started, NextSeq: next, SessionCreated: x.sessionCreated}
	if isClosed(x.done) {
		ended := x.ended
		in.EndedAt = &ended
		in.Status = x.result.Status
		in.ExitCode = x.result.ExitCode
		if x.err != nil {
			in.Status = "failed"
		}
	}
	return in
}

// execTable holds the live execs by id, and the finished background ones
// within keep.
type execTable struct {
	mu            sync.Mutex
	byID          map[string]*liveExec
	finished      []*liveExec // oldest first
	finishedBytes int64       // kept by finished, see liveExec.trim
	keep          finishedLimits
}

// finishedLimits bound the finished background execs kept (over all
// sessions) so that a late box_exec_wait, attach or kill still finds
// them: how many, for how long, and how many bytes of output in all
// (limits.max_finished_execs, finished_exec_retention_sec,
// max_finished_exec_bytes). Past any of them the oldest go first.
type finishedLimits struct {
	count     int
	retention time.Duration
	bytes     int64
}

func finishedLimitsOf(l Limits) finishedLimits {
	return finishedLimits{count: l.MaxFinishedExecs, retention: time.Duration(l.FinishedExecRetentionSec) * time.Second,
		bytes: int64(l.MaxFinishedExecBytes)}
}

func (t *execTable) add(x *liveExec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID == nil {
		t.byID = map[string]*liveExec{}
	}
	t.byID[x.id] = x
}

// addBackground adds a background exec unless its session already runs
// limit of them (counted and added in one step, so concurrent starts
// cannot overshoot); it returns how many run.
func (t *execTable) addBackground(x *liveExec, limit int) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, y := range t.byID {
		if y.s == x.s && y.background && !isClosed(y.done) {
			n++
		}
	}
	if n >= limit {
		return n, false
	}
	if t.byID == nil {
		t.byID = map[string]*liveExec{}
	}
	t.byID[x.id] = x
	return n, true
}

// ended keeps a finished background exec for later waits and drops a
// foreground one (its caller has the result).
func (t *execTable) ended(x *liveExec, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !x.background {
		delete(t.byID, x.id)
		return
	}
	x.kept = x.trim()
	t.finished = append(t.finished, x)
	t.finishedBytes += x.kept
	t.pruneLocked(now)
}

func (t *execTable) pruneLocked(now time.Time) {
	for len(t.finished) > 0 && (len(t.finished) > t.keep.count || now.Sub(t.finished[0].ended) > t.keep.retention ||
		t.finishedBytes > t.keep.bytes) {
		delete(t.byID, t.finished[0].id)
		t.finishedBytes -= t.finished[0].kept
		t.finished[0] = nil
		t.finished = t.finished[1:]
	}
}

// trim drops what a finished exec no longer needs and returns the bytes
// it keeps: the capture buffers (the result holds their final head and
// tail) and its replay log beyond FinishedExecReplayBytes.
func (x *liveExec) trim() int64 {
	x.stdout.release()
	x.stderr.release()
	replay := x.out.trim(FinishedExecReplayBytes)
	return int64(len(x.result.Stdout)+len(x.result.Stderr)) + int64(replay)
}

func (t *execTable) get(id string, now time.Time) (*liveExec, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked(now)
	if x, ok := t.byID[id]; ok {
		return x, nil
	}
	return nil, t.errNoExecLocked(id)
}

// errNoExecLocked answers an unknown exec id (and one of another
// namespace: the same words, so nothing tells a tenant it exists).
func (t *execTable) errNoExecLocked(id string) error {
	return boxerr.Validation("exec_id", "no exec %q: unknown, or finished and no longer kept "+
		"(limits.finished_exec_retention_sec %v, max_finished_execs %d, max_finished_exec_bytes %d)",
		id, t.keep.retention, t.keep.count, t.keep.bytes).With("exec_id", id).With("reason", "not_found")
}

// errNoExec is errNoExecLocked for a caller that does not hold t.mu.
func (t *execTable) errNoExec(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.errNoExecLocked(id)
}

// ofSession returns the execs of a session, running and kept.
func (t *execTable) ofSession(sessionID string, now time.Time) []*liveExec {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked(now)
	var xs []*liveExec
	for _, x := range t.byID {
		if x.sessionID == sessionID {
			xs = append(xs, x)
		}
	}
	return xs
}

// running returns the running execs that match.
func (t *execTable) running(match func(*liveExec) bool) []*liveExec {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*liveExec
	for _, x := range t.byID {
		if !isClosed(x.done) && match(x) {
			out = append(out, x)
		}
	}
	return out
}

// Execs is the exec service: box_exec, and the live execs a host reaches
// by id (streamed, in the background, with stdin or a terminal). It owns
// the table of live execs and the count of box_execs under way.
type Execs struct {
	r     *Runtime
	table execTable
	// boxExecs counts the execs that hold a session's exec lock
	// (box_exec), for Close to wait for.
	boxExecs sync.WaitGroup
}

func newExecs(r *Runtime, keep finishedLimits) *Execs {
	return &Execs{r: r, table: execTable{keep: keep}}
}

// stop cancels the running execs that match with cause and waits for
// them to end.
func (e *Execs) stop(match func(*liveExec) bool, cause error) {
	xs := e.table.running(match)
	for _, x := range xs {
		x.cancel(cause)
	}
	for _, x := range xs {
		<-x.done
	}
}

// stopAll stops every exec, box_exec ones included, and waits for them to
// end (at exit). Execs that begin later are refused, as the runtime is
// shutting down.
func (e *Execs) stopAll() {
	e.r.sessions.cancelBoxExecs(errCanceled)
	e.stop(func(*liveExec) bool { return true }, errCanceled)
	e.boxExecs.Wait()
}

// stopSession kills the live execs of s, whose sandbox is going.
func (e *Execs) stopSession(s *session) {
	e.stop(func(x *liveExec) bool { return x.s == s }, errDeleted)
}

// Start starts spec.Cmd in the background in its session (created or
// reused as for Exec) and returns at once. The command's life is its own:
// it outlives the request and the connection, until it ends, times out,
// is killed (Kill) or its session goes. Background execs do not take
// the session's exec lock, so they run next to each other and next to
// box_exec; box_exec calls stay serialised among themselves.
func (e *Execs) Start(ctx context.Context, spec Spec, opts ExecOptions) (ExecInfo, error) {
	if err := checkCmd(spec.Cmd); err != nil {
		return ExecInfo{}, err
	}
	r := e.r
	var err error
	if spec.SessionID, err = resolve(ctx, spec.SessionID); err != nil {
		return ExecInfo{}, err
	}
	s, created, err := r.acquire(ctx, spec, true)
	if err != nil {
		return ExecInfo{}, err
	}
	x, xctx := newLiveExec(context.WithoutCancel(ctx), s, spec, opts, true, e.outputLimit(spec), r.clock.Now())
	x.sessionCreated = created
	if n, ok := e.table.addBackground(x, MaxBackgroundExecs); !ok {
		x.cancel(nil)
		r.sessions.releaseExec(s)
		return ExecInfo{}, boxerr.CapacityExceeded("max_background_execs", MaxBackgroundExecs,
			"session %s already runs %d background execs (max_background_execs)", spec.SessionID, n)
	}
	info, deleting := r.sessions.execTarget(s)
	shutting, b := r.life.shuttingDown(), r.backends.current()
	r.counters.execs.Add(1)
	if deleting || shutting || b == nil {
		// Deletion or Close began before the exec was registered: it will
		// not see it, so the exec ends here.
		var err error = boxerr.SessionNotFound(spec.SessionID).With("reason", "being deleted")
		if shutting {
			err = errShuttingDown()
		}
		x.cancel(errDeleted)
		x.endOutput()
		r.sessions.releaseExec(s)
		e.finish(x, ExecResult{}, err)
		return ExecInfo{}, err
	}
	if opts.Sink != nil {
		x.follow(0, opts.Sink)
	}
	go func() {
		start := time.Now()
		res, _, err := e.run(xctx, spec, b, info, x)
		x.cancel(nil)
		// The session is released before waiters learn of the end, so one
		// that acts on it (the reaper, a suspend) finds it idle.
		r.sessions.releaseExec(s)
		e.finish(x, res, err)
		e.observe(spec, res, err, time.Since(start))
	}()
	return x.info(), nil
}

// finish records x's result and hands x to the table before closing
// done, so that a waiter woken by done finds the bookkeeping complete (a
// finished background exec is kept, and pruned after the retention).
func (e *Execs) finish(x *liveExec, res ExecResult, err error) {
	now := e.r.clock.Now()
	x.result, x.err, x.ended = res, err, now
	e.table.ended(x, now)
	close(x.done)
}

// Wait waits for a live exec to end and returns its result. When
// timeout (> 0) passes first, the result so far is returned with status
// running.
func (e *Execs) Wait(ctx context.Context, id string, timeout time.Duration) (ExecResult, error) {
	x, err := e.liveExecIn(ctx, id)
	if err != nil {
		return ExecResult{}, err
	}
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-x.done:
		return x.result, x.err
	case <-expired:
	case <-ctx.Done():
		return ExecResult{}, ctx.Err()
	}
	if isClosed(x.done) {
		// Ended meanwhile: its capture buffers are released.
		return x.result, x.err
	}
	res := ExecResult{SessionID: x.sessionID, Status: StatusRunning, DurationMS: time.Since(x.t0).Milliseconds()}
	res.Stdout, res.StdoutTruncated, res.StdoutBytes = x.stdout.snapshot()
	res.Stderr, res.StderrTruncated, res.StderrBytes = x.stderr.snapshot()
	if b := e.r.backends.current(); b != nil {
		res.BackendName = b.Name()
	}
	return res, nil
}

// Kill stops a live exec's whole process tree and waits for its end.
// SIGKILL (sig 0 means it too) kills at once; another signal goes to
// every process of the tree first, and whatever is still there after
// ExecKillGrace is killed. Killing an exec that already ended is no error.
func (e *Execs) Kill(ctx context.Context, id string, sig syscall.Signal) (ExecInfo, error) {
	x, err := e.liveExecIn(ctx, id)
	if err != nil {
		return ExecInfo{}, err
	}
	if sig != 0 && sig != syscall.SIGKILL {
		// The grace starts now: a backend that is slow to take the signal
		// (or does not take signals) still ends in a kill.
		t := time.NewTimer(ExecKillGrace)
		defer t.Stop()
		select {
		case x.signals <- sig:
			select {
			case <-x.done:
			case <-t.C:
			case <-ctx.Done():
				return ExecInfo{}, ctx.Err()
			}
		case <-x.done:
		case <-t.C:
		case <-ctx.Done():
			return ExecInfo{}, ctx.Err()
		}
	}
	x.cancel(errCanceled)
	select {
	case <-x.done:
	case <-ctx.Done():
		return ExecInfo{}, ctx.Err()
	}
	return x.info(), nil
}

// WriteStdin writes data to a live exec's stdin, then closes it when eof.
// It returns once the command's side took the data (a command that does
// not read its stdin makes it wait, as a full pipe would).
func (e *Execs) WriteStdin(ctx context.Context, id string, data []byte, eof bool) error {
	x, err := e.liveExecIn(ctx, id)
	if err != nil {
		return err
	}
	if x.stdinW == nil {
		return boxerr.Validation("exec_id", "exec %s was started without stdin", id).With("exec_id", id)
	}
	x.stdinMu.Lock()
	defer x.stdinMu.Unlock()
	switch {
	case isClosed(x.done):
		return boxerr.Validation("exec_id", "exec %s has ended", id).With("exec_id", id)
	case x.stdinClosed:
		return boxerr.Validation("eof", "stdin of exec %s is already closed", id).With("exec_id", id)
	}
	if len(data) > 0 {
		if _, err := x.stdinW.Write(data); err != nil {
			return boxerr.Validation("exec_id", "exec %s no longer reads its stdin: it has ended", id).With("exec_id", id).Wrap(err)
		}
	}
	if eof {
		x.stdinClosed = true
		return x.stdinW.Close()
	}
	return nil
}

// Resize changes the terminal size of a live exec started with a PTY.
func (e *Execs) Resize(ctx context.Context, id string, size backends.TTYSize) error {
	x, err := e.liveExecIn(ctx, id)
	if err != nil {
		return err
	}
	if x.tty == nil {
		return boxerr.Validation("exec_id", "exec %s has no terminal (start it with pty)", id).With("exec_id", id)
	}
	done := make(chan error, 1)
	select {
	case x.resize <- backends.Resize{Size: size, Done: done}:
		return <-done
	case <-x.done:
		return boxerr.Validation("exec_id", "exec %s has ended", id).With("exec_id", id)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// List lists a session's live execs, running and recently finished,
// oldest first.
func (e *Execs) List(ctx context.Context, sessionID string) ([]ExecInfo, error) {
	sessionID, err := resolve(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	xs := e.table.ofSession(sessionID, e.r.clock.Now())
	slices.SortFunc(xs, func(a, b *liveExec) int { return a.started.Compare(b.started) })
	out := make([]ExecInfo, 0, len(xs))
	for _, x := range xs {
		out = append(out, x.info())
	}
	return out, nil
}

// Attached is Attach's answer.
type Attached struct {
	ExecInfo
	Replay
}

// Attach sends a live exec's output to sink from fromSeq: first what
// the replay buffer still holds, then the rest as it comes, until the exec
// ends or sink fails. What was dropped before fromSeq is reported.
func (e *Execs) Attach(ctx context.Context, id string, fromSeq int64, sink ChunkSink) (Attached, error) {
	x, err := e.liveExecIn(ctx, id)
	if err != nil {
		return Attached{}, err
	}
	if fromSeq < 0 {
		return Attached{}, boxerr.Validation("from_seq", "from_seq must not be negative, got %d", fromSeq)
	}
	rep, _ := x.follow(fromSeq, sink)
	return Attached{ExecInfo: x.info(), Replay: rep}, nil
}
