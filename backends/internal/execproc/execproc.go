package execproc

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"sync"

	"github.com/boxrt/boxrt/backends"
)

// Proc is the part of a backends.Process that an exec-based managed
// process shares: its stdin, its stdout and stderr as pipes the backend's
// stream goroutine feeds, and its outcome. A backend embeds *Proc and adds
// Signal.
type Proc struct {
	stdin  io.WriteCloser
	stdout *io.PipeReader
	stderr *io.PipeReader

	done chan struct{}
	code int   // valid after done
	err  error // valid after done
}

// New returns a Proc whose Stdin is stdin, and the writers that feed its
// Stdout and Stderr. The backend closes them (with the stream's error) when
// the output ends, then calls Finish.
func New(stdin io.WriteCloser) (p *Proc, stdout, stderr *io.PipeWriter) {
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	return &Proc{stdin: stdin, stdout: outR, stderr: errR, done: make(chan struct{})}, outW, errW
}

func (p *Proc) Stdin() io.WriteCloser { return p.stdin }
func (p *Proc) Stdout() io.Reader     { return p.stdout }
func (p *Proc) Stderr() io.Reader     { return p.stderr }

// Wait returns the exit code; a process killed by signal n reads as -n
// (sandboxsh.SignalExitCode), as the reference and os/exec report it.
func (p *Proc) Wait() (int, error) {
	<-p.done
	return p.code, p.err
}

// Done is closed once the process has finished.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has finished: signalling it then is
// a no-op.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Finish records the outcome and releases Wait. It is called once, by the
// goroutine that ran the stream.
func (p *Proc) Finish(code int, err error) {
	p.code, p.err = code, err
	close(p.done)
}

// LimitedBuffer keeps the first Max bytes written to it and discards the
// rest, so a misbehaving helper cannot grow memory. It is safe for
// concurrent writers (stdout and stderr may share one).
type LimitedBuffer struct {
	Max int

	mu  sync.Mutex
	buf []byte
}

func (l *LimitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.Max - len(l.buf); room > 0 {
		l.buf = append(l.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *LimitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// OrDiscard is w, or io.Discard for a caller that wants no output.
func OrDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// Paths is where a command (kind "exec") or a managed process (kind
// "proc") of info's session runs: its directory (dir, else the session's
// mount path, else /), and a fresh pid file in pidDir that its wrapper
// script writes, through which helper execs signal its tree.
func Paths(info backends.Session, dir, kind, pidDir string) (workdir, pidFile string) {
	workdir = dir
	if workdir == "" {
		workdir = info.MountPath
	}
	if workdir == "" {
		workdir = "/"
	}
	buf := make([]byte, 8)
	if _, err := rand.Read(buf); err != nil {
		// crypto/rand does not fail on Linux; a constant would risk clashes.
		panic(err)
	}
	return workdir, pidDir + "/.boxrt-" + kind + "-" + hex.EncodeToString(buf) + ".pid"
}
