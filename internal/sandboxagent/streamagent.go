package sandboxagent

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// drainGrace is how long the agent keeps reading an exited process's
// output for what a background process that holds it still writes; what
// the process itself wrote is in the pipe already and read at once.
const drainGrace = 50 * time.Millisecond

// streamProc is the agent's side of a stream-mode child: the parent's
// ends of its pipes (or its terminal's master), the output window and the
// stdin queue.
type streamProc struct {
	outs  []*os.File // stdout and stderr, or the master alone
	stdin *os.File   // the stdin pipe's write end, or a copy of the master
	tty   bool
	in    *streamQueue
	pumps sync.WaitGroup

	mu       sync.Mutex
	cond     sync.Cond
	credit   int  // output bytes the host still takes
	reserved int  // output bytes a pump is reading, taken from credit
	inFlight int  // stdin bytes taken and not yet credited back
	orphaned bool // the connection is gone: output is read and dropped
}

// handleStream takes a stream-mode frame of the host's.
func (a *agent) handleStream(fc *frameConn, op string, payload []byte) error {
	switch op {
	case opRun:
		var m runMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		if err := m.validate(); err != nil {
			return &ProtocolError{Reason: "run: " + err.Error()}
		}
		if m.LongArg {
			if err := a.takeLongArg(m.ID, m.Argv); err != nil {
				return err
			}
		}
		return a.runStream(fc, &m)
	case opInput:
		var m inputMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		if sp := a.stream(m.ID); sp != nil {
			return sp.input(&m)
		}
	case opCredit:
		var m creditMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		if sp := a.stream(m.ID); sp != nil {
			return sp.grant(m.Bytes)
		}
	}
	// Frames for a process that has exited meanwhile are no error.
	return nil
}

func (a *agent) stream(id uint64) *streamProc {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.streams[id]
}

// runStream starts m with pipes or a terminal the agent makes, and answers
// started or failed.
func (a *agent) runStream(fc *frameConn, m *runMsg) error {
	sp, child, err := newStreamProc(m)
	if err != nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.sendLocked(failedMsg{Op: opFailed, ID: m.ID, Error: cut(err.Error())})
	}
	env := m.Env
	if m.Inherit {
		env = overlay(os.Environ(), m.Env)
	}
	// Counted before the child can exit: finishStream waits for them.
	sp.pumps.Add(len(sp.outs))
	started := false
	err = a.spawn(&spawnMsg{Op: opSpawn, ID: m.ID, Argv: m.Argv, Env: env, Dir: m.Dir, TTY: m.TTY}, child,
		func(int) { a.streams[m.ID] = sp; started = true })
	if !started {
		sp.stdin.Close()
		for _, f := range sp.outs {
			f.Close()
		}
		return err
	}
	for i, f := range sp.outs {
		go sp.pump(a, fc, m.ID, i+1, f)
	}
	go sp.writeStdin(a, fc, m.ID)
	return err
}

// overlay is base with the variables of over set (over wins).
func overlay(base, over []string) []string {
	set := map[string]bool{}
	for _, kv := range over {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		if name, _, _ := strings.Cut(kv, "="); !set[name] {
			out = append(out, kv)
		}
	}
	return append(out, over...)
}

// newStreamProc makes m's pipes or terminal: the parent's ends (pollable,
// so that deadlines and Close end a pending read or write) and the child's
// descriptors, which spawn closes.
func newStreamProc(m *runMsg) (*streamProc, []int, error) {
	sp := &streamProc{tty: m.TTY, in: newStreamQueue(), credit: streamWindow}
	sp.cond.L = &sp.mu
	if m.TTY {
		master, slave, err := agentPTY()
		if err != nil {
			return nil, nil, err
		}
		defer slave.Close()
		setSize(master, m.Rows, m.Cols)
		in, err := unix.FcntlInt(master.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			master.Close()
			return nil, nil, fmt.Errorf("copying the terminal's master: %w", err)
		}
		fd, err := unix.FcntlInt(slave.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			master.Close()
			unix.Close(in)
			return nil, nil, fmt.Errorf("copying the terminal's slave: %w", err)
		}
		sp.outs, sp.stdin = []*os.File{master}, os.NewFile(uintptr(in), "pty")
		return sp, []int{fd}, nil
	}
	var p [3][2]int // read end, write end
	for i := range p {
		if err := unix.Pipe2(p[i][:], unix.O_CLOEXEC); err != nil {
			for _, q := range p[:i] {
				closeFDs(q[:])
			}
			return nil, nil, fmt.Errorf("making pipes: %w", err)
		}
	}
	// The child reads its stdin and writes its outputs.
	parent := []int{p[0][1], p[1][0], p[2][0]}
	files := make([]*os.File, 3)
	for i, fd := range parent {
		// Non-blocking, os.NewFile gives a pollable File; the child's
		// ends are other open files, blocking.
		unix.SetNonblock(fd, true)
		files[i] = os.NewFile(uintptr(fd), "pipe")
	}
	sp.stdin, sp.outs = files[0], files[1:]
	return sp, []int{p[0][0], p[1][1], p[2][1]}, nil
}

// agentPTY opens a pseudo-terminal in the sandbox the agent runs in.
func agentPTY() (master, slave *os.File, err error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	return ptyOf(mfd)
}

func setSize(master *os.File, rows, cols uint16) {
	if raw, err := master.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
		})
	}
}

// reserve waits for output window and takes up to a frame's worth of it;
// with the connection gone, output is only drained.
func (sp *streamProc) reserve() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for sp.credit == 0 && !sp.orphaned {
		sp.cond.Wait()
	}
	if sp.orphaned {
		return streamChunk
	}
	n := min(sp.credit, streamChunk)
	sp.credit -= n
	sp.reserved += n
	return n
}

// release ends a pump's reservation of n bytes, of which it sent k.
func (sp *streamProc) release(n, k int) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.orphaned {
		sp.reserved -= n
		sp.credit += n - k
	}
}

// grant gives back window the host has written out.
func (sp *streamProc) grant(n int) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	// What is neither credit nor being read has been sent: the host may
	// give back that much.
	if n <= 0 || sp.credit+sp.reserved+n > streamWindow {
		return &ProtocolError{Reason: fmt.Sprintf("credit of %d bytes with %d sent and not credited", n, streamWindow-sp.credit-sp.reserved)}
	}
	sp.credit += n
	sp.cond.Broadcast()
	return nil
}

// pump sends what f (the output fd: 1 or 2) yields, within the window,
// until it ends (EOF, or an empty pipe after the drain deadline).
func (sp *streamProc) pump(a *agent, fc *frameConn, id uint64, fd int, f *os.File) {
	defer sp.pumps.Done()
	buf := make([]byte, streamChunk)
	r := &DrainReader{F: f}
	for {
		n := sp.reserve()
		k, err := r.Read(buf[:n])
		sp.release(n, k)
		if k > 0 {
			a.sendOn(fc, outputMsg{Op: opOutput, ID: id, FD: fd, Data: buf[:k]})
		}
		if err != nil {
			return
		}
	}
}

// sendOn sends m if fc is still the connection; a failed write drops it.
func (a *agent) sendOn(fc *frameConn, m any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fc != fc {
		return
	}
	if err := a.sendLocked(m); err != nil {
		fc.c.Close()
	}
}

// input queues stdin data (within the window) and its end.
func (sp *streamProc) input(m *inputMsg) error {
	sp.mu.Lock()
	if len(m.Data) > streamChunk || sp.inFlight+len(m.Data) > streamWindow {
		sp.mu.Unlock()
		return &ProtocolError{Reason: fmt.Sprintf("input of %d bytes with %d of %d in flight", len(m.Data), sp.inFlight, streamWindow)}
	}
	sp.inFlight += len(m.Data)
	sp.mu.Unlock()
	if len(m.Data) > 0 {
		sp.in.put(0, m.Data)
	}
	if m.EOF {
		sp.in.close()
	}
	return nil
}

// veof is a terminal's end-of-file character (^D): a terminal has no
// half-close, so the end of stdin is typed.
const veof = 0x04

// writeStdin writes the queued stdin to the child and credits it back; a
// write that fails (the child closed its stdin, or exited) drops the rest.
func (sp *streamProc) writeStdin(a *agent, fc *frameConn, id uint64) {
	defer sp.stdin.Close()
	var broken error
	for {
		data, end := sp.in.take()
		if d := data[0]; d != nil {
			if broken == nil {
				_, broken = sp.stdin.Write(d)
			}
			sp.mu.Lock()
			sp.inFlight -= len(d)
			sp.mu.Unlock()
			a.sendOn(fc, creditMsg{Op: opCredit, ID: id, Bytes: len(d)})
		}
		if end {
			if sp.tty && broken == nil {
				sp.stdin.Write([]byte{veof})
			}
			return
		}
	}
}

// finishStream sends id's exited once its output is drained: what the
// process wrote is read at once, what a background process holding the
// output writes later is read for drainGrace.
func (a *agent) finishStream(fc *frameConn, id uint64, sp *streamProc, e Exit) {
	for _, f := range sp.outs {
		f.SetReadDeadline(time.Now().Add(drainGrace))
	}
	sp.pumps.Wait()
	for _, f := range sp.outs {
		f.Close()
	}
	// A write blocked on a child that no longer reads ends here.
	sp.in.close()
	sp.stdin.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.streams[id] != sp {
		return
	}
	delete(a.streams, id)
	if a.fc == fc {
		if err := a.sendLocked(exitedMsg{Op: opExited, ID: id, Code: &e.Code, Signal: &e.Signal}); err != nil {
			fc.c.Close()
		}
	}
}

// orphan is the end of the connection: the process runs on, its output is
// drained and dropped until it ends, its stdin is closed.
func (sp *streamProc) orphan() {
	sp.mu.Lock()
	sp.orphaned = true
	sp.cond.Broadcast()
	sp.mu.Unlock()
	sp.in.close()
	sp.stdin.Close()
	go func() {
		sp.pumps.Wait()
		for _, f := range sp.outs {
			f.Close()
		}
	}()
}
