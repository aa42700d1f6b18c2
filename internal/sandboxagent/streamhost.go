package sandboxagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Bridge speaks the protocol, in stream mode, to an agent reached through
// a byte stream: r is what the agent says (a `boxrt agent --bridge`'s
// stdout), w what it hears (that command's stdin). It waits for the hello
// (at most 5 s, and ctx). The Conn's frames pass through a socket pair, so
// that they are read, bounded and checked as any agent's; the agent cannot
// send descriptors this way, and Spawn (which passes some) is for local
// agents only: use Run.
//
// Closing the Conn closes w. The goroutine copying r ends when r does:
// the caller ends the stream (the exec) once the Conn is done.
func Bridge(ctx context.Context, r io.Reader, w io.WriteCloser) (*Conn, error) {
	ours, theirs, err := socketPair()
	if err != nil {
		w.Close()
		return nil, err
	}
	written := make(chan struct{})
	go func() {
		defer close(written)
		io.Copy(w, theirs)
		w.Close()
	}()
	go func() {
		io.Copy(theirs, r)
		theirs.CloseWrite()
		<-written
		theirs.Close()
	}()
	fc := newFrameConn(ours, false)
	pid, err := readHello(ctx, fc, answerTimeout)
	if err != nil {
		ours.Close()
		return nil, err
	}
	return newConn(fc, pid, 0, answerTimeout), nil
}

func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socket pair: %w", err)
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "agent-bridge")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				unix.Close(fds[1])
			}
			return nil, nil, err
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1], nil
}

// RunRequest is a process to start in stream mode: the agent makes its
// pipes or terminal, and its bytes travel as frames.
type RunRequest struct {
	Argv []string // argv[0] without a slash is looked up in Env's PATH
	Env  []string // the complete environment, KEY=VALUE
	Dir  string   // the working directory in the sandbox; must exist ("" is /)
	// InheritEnv lays Env over the agent's own environment instead of
	// making it the whole of it.
	InheritEnv bool
	// TTY, when set, gives the process a terminal of that size as its
	// stdin, stdout and stderr: all its output goes to Stdout, and the
	// end of Stdin is typed as ^D.
	TTY *TermSize
	// Stdin is read until its end, which closes the process's stdin; nil
	// is an empty stdin (with a terminal: nothing typed). A Read pending
	// when the process ends keeps Run's reader until it returns: the
	// caller closes Stdin.
	Stdin io.Reader
	// Stdout and Stderr get the output (nil: dropped), from one goroutine
	// each, before Wait returns the exit. A writer that fails drops the
	// rest of its output.
	Stdout, Stderr io.Writer
}

// procStream is the host's side of a stream-mode process.
type procStream struct {
	c       *Conn
	id      uint64
	tty     bool
	out     [2]io.Writer
	q       *streamQueue
	discard atomic.Bool // Run gave up: nobody reads the output
	wake    chan struct{}

	// Under c.mu:
	owed     int // output bytes the agent may still send
	inFlight int // stdin bytes sent and not yet credited back

	// Set once, before q is closed.
	exit Exit
	err  error
}

// Run asks the agent to start req with pipes or a terminal it makes, and
// waits for started or failed as Spawn does. Output goes to req's writers
// as it comes, within a window: an agent that sends more than the host
// has room for breaks the protocol, and a slow writer holds the process's
// output back in the sandbox.
func (c *Conn) Run(ctx context.Context, req RunRequest) (*Proc, error) {
	sreq := SpawnRequest{Argv: req.Argv, Env: req.Env, Dir: req.Dir}
	if err := sreq.validate(); err != nil {
		return nil, fmt.Errorf("sandbox run: %w", err)
	}
	m := runMsg{Op: opRun, Argv: req.Argv, Env: req.Env, Dir: req.Dir, Inherit: req.InheritEnv}
	if req.TTY != nil {
		if req.TTY.Rows == 0 || req.TTY.Cols == 0 {
			return nil, errors.New("sandbox run: a terminal needs rows and cols")
		}
		m.TTY, m.Rows, m.Cols = true, req.TTY.Rows, req.TTY.Cols
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &procStream{c: c, tty: m.TTY, out: [2]io.Writer{orDiscard(req.Stdout), orDiscard(req.Stderr)},
		q: newStreamQueue(), wake: make(chan struct{}, 1), owed: streamWindow}
	id, ps, err := c.register()
	if err != nil {
		return nil, err
	}
	ps.stream, s.id, m.ID = s, id, id
	payload, err := c.encodeLong(id, &m, req.Argv, func() {
		m.Argv = append(append([]string(nil), req.Argv[:len(req.Argv)-1]...), "")
		m.LongArg = true
	})
	if err != nil {
		err = fmt.Errorf("sandbox run: %w", err)
	}
	if err == nil {
		err = c.send(payload, nil)
	}
	if err != nil {
		c.unregister(id)
		return nil, err
	}
	p, err := c.await(ctx, id, ps)
	if err != nil {
		return nil, err
	}
	switch {
	case req.Stdin != nil:
		go s.pumpStdin(p, req.Stdin)
	case !s.tty:
		s.sendInput(nil, true)
	}
	return p, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// output takes an output frame of the agent's for p.
func (c *Conn) output(m *outputMsg) error {
	c.mu.Lock()
	p := c.procs[m.ID]
	if p == nil || p.stream == nil {
		c.mu.Unlock()
		return &ProtocolError{Reason: fmt.Sprintf("output for id %d, which has no running stream process", m.ID)}
	}
	s := p.stream
	if err := m.validate(s.tty, s.owed); err != nil {
		c.mu.Unlock()
		return &ProtocolError{Reason: fmt.Sprintf("output %d: %v", m.ID, err)}
	}
	s.owed -= len(m.Data)
	c.mu.Unlock()
	s.q.put(m.FD-1, m.Data)
	return nil
}

// credit takes the agent's acknowledgement of stdin written to p.
func (c *Conn) credit(m *creditMsg) error {
	c.mu.Lock()
	p := c.procs[m.ID]
	if p == nil || p.stream == nil {
		c.mu.Unlock()
		return &ProtocolError{Reason: fmt.Sprintf("credit for id %d, which has no running stream process", m.ID)}
	}
	s := p.stream
	if err := m.validate(s.inFlight); err != nil {
		c.mu.Unlock()
		return &ProtocolError{Reason: fmt.Sprintf("credit %d: %v", m.ID, err)}
	}
	s.inFlight -= m.Bytes
	c.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// end is the process's end (or the connection's, err set): the writer
// finishes p once the queued output is written.
func (s *procStream) end(e Exit, err error) {
	s.exit, s.err = e, err
	s.q.close()
}

// write passes the output on to the caller's writers and gives the window
// back, then finishes p.
func (s *procStream) write(p *Proc) {
	failed := [2]bool{}
	for {
		data, end := s.q.take()
		n := 0
		for i, d := range data {
			if d == nil {
				continue
			}
			n += len(d)
			if !failed[i] && !s.discard.Load() {
				_, err := s.out[i].Write(d)
				failed[i] = err != nil
			}
		}
		if n > 0 {
			s.c.mu.Lock()
			s.owed += n
			s.c.mu.Unlock()
			if payload, err := json.Marshal(creditMsg{Op: opCredit, ID: s.id, Bytes: n}); err == nil {
				s.c.send(payload, nil)
			}
		}
		if end {
			p.finish(s.exit, s.err)
			return
		}
	}
}

// pumpStdin sends r to the process within the window, then its end.
func (s *procStream) pumpStdin(p *Proc, r io.Reader) {
	buf := make([]byte, streamChunk)
	for {
		room := 0
		for room == 0 {
			s.c.mu.Lock()
			room = min(streamWindow-s.inFlight, streamChunk)
			s.c.mu.Unlock()
			if room > 0 {
				break
			}
			select {
			case <-s.wake:
			case <-p.done:
				return
			}
		}
		n, err := r.Read(buf[:room])
		select {
		case <-p.done:
			return
		default:
		}
		if n > 0 && s.sendInput(buf[:n], false) != nil {
			return
		}
		if err != nil {
			s.sendInput(nil, true)
			return
		}
	}
}

func (s *procStream) sendInput(data []byte, eof bool) error {
	s.c.mu.Lock()
	s.inFlight += len(data)
	s.c.mu.Unlock()
	payload, err := json.Marshal(inputMsg{Op: opInput, ID: s.id, Data: data, EOF: eof})
	if err != nil {
		return err
	}
	return s.c.send(payload, nil)
}
