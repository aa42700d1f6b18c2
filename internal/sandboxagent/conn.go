package sandboxagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Conn is one agent's connection. One reader goroutine demultiplexes the
// agent's answers by spawn id.
type Conn struct {
	fc       *frameConn
	agentPID int
	peerPID  int
	timeout  time.Duration

	done       chan struct{}
	readerDone chan struct{}

	mu     sync.Mutex
	err    error // set once, with done closed
	nextID uint64
	spawns map[uint64]*pendingSpawn // sent, not answered
	procs  map[uint64]*Proc         // started, not exited
	// resizes: spawn id → the resizes sent and not answered, oldest
	// first (ptyrelay_host.go).
	resizes  map[uint64][]chan struct{}
	resizeMu sync.Mutex // orders a resize's registration and its frame
}

// pendingSpawn is a spawn waiting for started or failed.
type pendingSpawn struct {
	answer chan spawnAnswer // buffered: the reader never blocks on it
	// abandoned: Spawn's ctx ended first; a process started after all
	// is killed.
	abandoned bool
	stream    *procStream // a Run's
}

type spawnAnswer struct {
	proc    *Proc
	failure string
}

func newConn(fc *frameConn, agentPID, peerPID int, timeout time.Duration) *Conn {
	c := &Conn{
		fc:         fc,
		agentPID:   agentPID,
		peerPID:    peerPID,
		timeout:    timeout,
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
		spawns:     map[uint64]*pendingSpawn{},
		procs:      map[uint64]*Proc{},
		resizes:    map[uint64][]chan struct{}{},
	}
	go c.read()
	return c
}

// AgentPID is the pid the agent said it has in the sandbox (validated to
// be in 1..4194304; it is the agent's word, nothing more).
func (c *Conn) AgentPID() int { return c.agentPID }

// PeerPID is the pid of the process that connected, in boxrt's pid
// namespace, as the kernel saw it at connect time (SO_PEERCRED); 0 if the
// kernel could not say. Unlike AgentPID it is not the agent's word: a
// backend that knows its sandbox's first process can check that it, and
// not some other process of the session, is the one connected.
func (c *Conn) PeerPID() int { return c.peerPID }

// Done is closed when the connection is lost or closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is nil while the connection is up, then ErrAgentLost (wrapped) or a
// *ProtocolError.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection and waits for its reader; pending Waits get
// ErrAgentLost. The agent's processes keep running.
func (c *Conn) Close() error {
	c.fail(fmt.Errorf("%w: connection closed by boxrt", ErrAgentLost))
	<-c.readerDone
	return nil
}

// fail ends the connection with err, once: every pending Wait gets it.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	procs := c.procs
	c.procs = nil
	c.spawns = nil
	c.resizes = nil
	close(c.done)
	c.mu.Unlock()
	for _, p := range procs {
		if p.stream != nil {
			p.stream.end(Exit{}, err)
		} else {
			p.finish(Exit{}, err)
		}
	}
	c.fc.c.Close()
}

// read is the reader goroutine: it ends the connection on the first
// error.
func (c *Conn) read() {
	defer close(c.readerDone)
	for {
		payload, err := c.fc.readFrame()
		if err == nil {
			err = c.handle(payload)
		} else {
			err = readError(err)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// handle takes one frame of the agent's.
func (c *Conn) handle(payload []byte) error {
	op, err := opOf(payload)
	if err != nil {
		return err
	}
	switch op {
	case opStarted:
		var m startedMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		if err := m.validate(); err != nil {
			return &ProtocolError{Reason: fmt.Sprintf("started %d: %v", m.ID, err)}
		}
		return c.answer(m.ID, spawnAnswer{proc: &Proc{c: c, id: m.ID, pid: m.PID, done: make(chan struct{})}})
	case opFailed:
		var m failedMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		if err := m.validate(); err != nil {
			return &ProtocolError{Reason: fmt.Sprintf("failed %d: %v", m.ID, err)}
		}
		return c.answer(m.ID, spawnAnswer{failure: m.Error})
	case opExited:
		var m exitedMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		if err := m.validate(); err != nil {
			return &ProtocolError{Reason: fmt.Sprintf("exited %d: %v", m.ID, err)}
		}
		return c.exited(m.ID, Exit{Code: *m.Code, Signal: *m.Signal})
	case opResized:
		var m resizedMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		return c.resized(m.ID)
	case opOutput:
		var m outputMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		return c.output(&m)
	case opCredit:
		var m creditMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		return c.credit(&m)
	}
	return &ProtocolError{Reason: "unknown op " + short(op)}
}

// answer hands a spawn its answer. A process whose Spawn gave up is
// killed.
func (c *Conn) answer(id uint64, a spawnAnswer) error {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	ps, ok := c.spawns[id]
	if !ok {
		c.mu.Unlock()
		return &ProtocolError{Reason: fmt.Sprintf("answer for spawn id %d, which is not waiting for one", id)}
	}
	delete(c.spawns, id)
	if a.proc != nil {
		c.procs[id] = a.proc
		if a.proc.stream = ps.stream; ps.stream != nil {
			ps.stream.discard.Store(ps.abandoned)
			go ps.stream.write(a.proc)
		}
	}
	c.mu.Unlock()
	if ps.abandoned {
		if a.proc != nil {
			return c.signal(id, syscall.SIGKILL)
		}
		return nil
	}
	ps.answer <- a
	return nil
}

func (c *Conn) exited(id uint64, e Exit) error {
	c.mu.Lock()
	p, ok := c.procs[id]
	delete(c.procs, id)
	c.mu.Unlock()
	if !ok {
		return &ProtocolError{Reason: fmt.Sprintf("exited for id %d, which has no running process", id)}
	}
	if p.stream != nil {
		p.stream.end(e, nil)
	} else {
		p.finish(e, nil)
	}
	return nil
}

// SpawnRequest is a process to start in the sandbox.
type SpawnRequest struct {
	Argv []string // argv[0] without a slash is looked up in Env's PATH
	Env  []string // the complete environment, KEY=VALUE
	Dir  string   // the working directory in the sandbox; must exist ("" is /)
	// TTY: Stdin is a pty slave, made the controlling terminal and the
	// child's stdin, stdout and stderr; Stdout and Stderr must be nil.
	TTY bool
	// Term: the agent makes the child's terminal itself, in the sandbox,
	// of this size, and relays between it and Stdin (a pipe's read end)
	// and Stdout (a pipe's write end; the terminal's output); Stderr must
	// be nil. For a sandbox whose kernel does not take a terminal passed
	// in (gVisor); the terminal's output then passes through the agent
	// (ptyrelay.go). Proc.Resize sizes it.
	Term *TermSize
	// The child's ends; nil is /dev/null. Spawn does not close them: the
	// caller closes its copies once Spawn returned.
	Stdin, Stdout, Stderr *os.File
}

// validate says what is wrong with req before anything is sent.
func (req *SpawnRequest) validate() error {
	switch {
	case len(req.Argv) == 0:
		return errors.New("argv is empty")
	case req.Dir != "" && !path.IsAbs(req.Dir):
		return fmt.Errorf("dir %q is not absolute", req.Dir)
	case req.TTY && (req.Stdin == nil || req.Stdout != nil || req.Stderr != nil):
		return errors.New("with TTY, Stdin is the pty slave and Stdout and Stderr are nil")
	case req.Term != nil:
		if err := req.validateTerm(); err != nil {
			return err
		}
	}
	if err := checkStrings("argv", req.Argv); err != nil {
		return err
	}
	return checkStrings("env", req.Env)
}

// files is what req passes: the pty slave, or stdin, stdout and stderr
// with /dev/null for a nil one.
func (req *SpawnRequest) files() ([]*os.File, error) {
	if req.TTY {
		return []*os.File{req.Stdin}, nil
	}
	if req.Term != nil {
		return []*os.File{req.Stdin, req.Stdout}, nil
	}
	files := []*os.File{req.Stdin, req.Stdout, req.Stderr}
	for i, f := range files {
		if f == nil {
			null, err := devNull()
			if err != nil {
				return nil, err
			}
			files[i] = null
		}
	}
	return files, nil
}

// devNull is the /dev/null every spawn passes for a stream it has none
// for, opened once: opening it per spawn cost an exec several system calls.
var devNull = sync.OnceValues(func() (*os.File, error) {
	return os.OpenFile(os.DevNull, os.O_RDWR, 0)
})

// Spawn asks the agent to start req and waits (at most 5 s, and ctx) for
// it to say started or failed. A refusal is a *SpawnError; an invalid req
// is refused before anything is sent. No answer in time is a
// *ProtocolError, and ends the connection. When ctx ends first, a process
// the agent starts after all is killed.
func (c *Conn) Spawn(ctx context.Context, req SpawnRequest) (*Proc, error) {
	if err := req.validate(); err != nil {
		return nil, fmt.Errorf("sandbox spawn: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	files, err := req.files()
	if err != nil {
		return nil, fmt.Errorf("sandbox spawn: %w", err)
	}
	id, ps, err := c.register()
	if err != nil {
		return nil, err
	}
	if err := c.sendSpawn(id, &req, files); err != nil {
		c.unregister(id)
		return nil, err
	}
	p, err := c.await(ctx, id, ps)
	if p != nil {
		p.term = req.Term != nil
	}
	return p, err
}

// await waits for the answer to spawn (or run) id.
func (c *Conn) await(ctx context.Context, id uint64, ps *pendingSpawn) (*Proc, error) {
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	select {
	case a := <-ps.answer:
		return a.result()
	case <-c.done:
		return nil, c.Err()
	case <-timer.C:
		err := &ProtocolError{Reason: fmt.Sprintf("no answer to spawn %d within %s", id, c.timeout)}
		c.fail(err)
		return nil, err
	case <-ctx.Done():
		return nil, c.abandon(id, ps, ctx.Err())
	}
}

func (a spawnAnswer) result() (*Proc, error) {
	if a.proc == nil {
		return nil, &SpawnError{Reason: a.failure}
	}
	return a.proc, nil
}

func (c *Conn) register() (uint64, *pendingSpawn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, nil, c.err
	}
	c.nextID++
	ps := &pendingSpawn{answer: make(chan spawnAnswer, 1)}
	c.spawns[c.nextID] = ps
	return c.nextID, ps, nil
}

func (c *Conn) unregister(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.spawns, id)
}

// abandon gives up on spawn id: if its answer is in, a started process is
// killed; if not, the reader kills it when it comes.
func (c *Conn) abandon(id uint64, ps *pendingSpawn, err error) error {
	c.mu.Lock()
	if _, waiting := c.spawns[id]; waiting {
		ps.abandoned = true
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	select {
	case a := <-ps.answer:
		if a.proc != nil {
			if a.proc.stream != nil {
				a.proc.stream.discard.Store(true)
			}
			a.proc.Signal(syscall.SIGKILL)
		}
	default: // the connection ended
	}
	return err
}

func (c *Conn) sendSpawn(id uint64, req *SpawnRequest, files []*os.File) error {
	m := spawnMsg{Op: opSpawn, ID: id, Argv: req.Argv, Env: req.Env, Dir: req.Dir, TTY: req.TTY, Term: req.Term.wire()}
	payload, err := c.encodeLong(id, &m, req.Argv, func() {
		m.Argv = append(append([]string(nil), req.Argv[:len(req.Argv)-1]...), "")
		m.LongArg = true
	})
	if err != nil {
		return fmt.Errorf("sandbox spawn: %w", err)
	}
	fds := make([]int, len(files))
	for i, f := range files {
		// Fd makes the descriptor blocking, as a child's stdio must be
		// (os/exec does the same).
		fds[i] = int(f.Fd())
	}
	err = c.send(payload, fds)
	runtime.KeepAlive(files)
	return err
}

// send writes a frame; a failed write ends the connection.
func (c *Conn) send(payload []byte, fds []int) error {
	select {
	case <-c.done:
		return c.Err()
	default:
	}
	if err := c.fc.writeFrame(payload, fds); err != nil {
		c.fail(fmt.Errorf("%w: %v", ErrAgentLost, err))
		return c.Err()
	}
	return nil
}

func (c *Conn) signal(id uint64, sig syscall.Signal) error {
	payload, err := json.Marshal(signalMsg{Op: opSignal, ID: id, Signal: int(sig)})
	if err != nil {
		return err
	}
	return c.send(payload, nil)
}

// Exit is how a process ended.
type Exit struct {
	Code   int // 0..255; 128+Signal when killed by a signal
	Signal int // 0 unless killed by a signal
}

// Proc is a process the agent started.
type Proc struct {
	c      *Conn
	id     uint64
	pid    int
	stream *procStream // a Run's; set before the Proc is handed out
	term   bool        // a Spawn's with a terminal the agent made
	done   chan struct{}
	exit   Exit
	err    error
}

// Done is closed once the process exited or the connection ended first;
// Wait then returns at once.
func (p *Proc) Done() <-chan struct{} { return p.done }

// PID is the process's pid in the sandbox's pid namespace (validated to
// be in 1..4194304, the agent's word).
func (p *Proc) PID() int { return p.pid }

func (p *Proc) finish(e Exit, err error) {
	p.exit, p.err = e, err
	close(p.done)
}

// Wait waits for the process to exit. It returns ErrAgentLost or a
// *ProtocolError when the connection ended first, ctx.Err() when ctx did.
func (p *Proc) Wait(ctx context.Context) (Exit, error) {
	select {
	case <-p.done:
		return p.exit, p.err
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

// Signal asks the agent to send sig to the process's group (the process
// is a session leader, its pgid is its pid), so that what it left in the
// background gets it too; it works after the process exited while the
// group lives. The agent does not answer: a kill that must happen is the
// host's (the sandbox's cgroup or pid namespace).
func (p *Proc) Signal(sig syscall.Signal) error {
	if sig <= 0 || sig > maxSignal {
		return fmt.Errorf("sandbox signal %d is outside 1..%d", sig, maxSignal)
	}
	return p.c.signal(p.id, sig)
}
