package reconnect

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stateDirEnv is the variable boxrt serve reads its default --state-dir
// from; privateStateDirEnv is its --private-state-dir, which a --state-dir
// on the command line overrides.
const (
	stateDirEnv        = "BOXRT_STATE_DIR"
	privateStateDirEnv = "BOXRT_PRIVATE_STATE_DIR"
)

// chooseStateDir settles which state directory the children use (see
// WithStateDir): the one asked for, or a private one made here, for which
// it sets o.cleanup.
func chooseStateDir(o *options) error {
	switch {
	case o.stateDir != "":
		o.env = withEnv(o.env, stateDirEnv+"="+o.stateDir)
		return nil
	case hasEnv(o.env, stateDirEnv):
		return nil
	}
	dir, err := os.MkdirTemp("", "boxrt-private-")
	if err != nil {
		return fmt.Errorf("reconnect: private state directory: %w", err)
	}
	o.env = withEnv(o.env, privateStateDirEnv+"="+dir)
	log := o.logger
	o.cleanup = func() {
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("boxrt: cannot remove the private state directory", "dir", dir, "err", err)
		}
	}
	return nil
}

// hasEnv reports whether an explicit environment (WithEnv) sets key; the
// inherited one does not count: a host's own BOXRT_STATE_DIR is most
// likely the directory of the server it runs next to.
func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// withEnv is env (this process's when nil) plus kvs, which win: os/exec
// keeps the last value of a repeated key.
func withEnv(env []string, kvs ...string) []string {
	if env == nil {
		env = os.Environ()
	}
	return append(slices.Clip(env), kvs...)
}

// child is a spawned runtime process.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when Wait returned
	err    error         // Wait's result; read after exited

	stderrR    *os.File
	stderrDone chan struct{}
	tail       *tailBuffer
}

// startChild starts the command with three os.Pipe pairs. Using *os.File
// for all three streams keeps os/exec from adding copy goroutines, so Wait
// returns the moment the process exits — even when a grandchild inherited
// and still holds one of the pipes — and the exit is noticed at once.
func startChild(o *options) (ch *child, stdin, stdout *os.File, err error) {
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	pipe := func() (*os.File, *os.File) {
		if err != nil {
			return nil, nil
		}
		var r, w *os.File
		r, w, err = os.Pipe()
		files = append(files, r, w)
		return r, w
	}
	inR, inW := pipe()
	outR, outW := pipe()
	errR, errW := pipe()
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}

	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Env = o.env
	cmd.Dir = o.dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	if err := cmd.Start(); err != nil {
		closeAll()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return nil, nil, nil, permanent(fmt.Errorf("cannot start %s: %w", o.command[0], err))
		}
		return nil, nil, nil, fmt.Errorf("cannot start %s: %w", o.command[0], err)
	}
	// The child has its copies; ours would keep the pipes open after it
	// exits and hide the EOF.
	_ = inR.Close()
	_ = outW.Close()
	_ = errW.Close()

	ch = &child{cmd: cmd, exited: make(chan struct{}), stderrR: errR, stderrDone: make(chan struct{}), tail: &tailBuffer{max: 2048}}
	go func() {
		ch.err = cmd.Wait()
		close(ch.exited)
	}()
	go ch.copyStderr(o.stderr)
	return ch, inW, outR, nil
}

// copyStderr forwards the child's stderr and keeps a tail for error
// messages. It keeps draining when w fails: a child blocked on a full
// stderr pipe would look like a hung runtime.
func (ch *child) copyStderr(w io.Writer) {
	defer close(ch.stderrDone)
	buf := make([]byte, 32<<10)
	for {
		n, err := ch.stderrR.Read(buf)
		if n > 0 {
			_, _ = ch.tail.Write(buf[:n])
			if w != nil {
				if _, werr := w.Write(buf[:n]); werr != nil {
					w = nil
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (ch *child) pid() int { return ch.cmd.Process.Pid }

func (ch *child) hasExited() bool {
	select {
	case <-ch.exited:
		return true
	default:
		return false
	}
}

func (ch *child) waitExit(d time.Duration) bool {
	if d <= 0 {
		return ch.hasExited()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch.exited:
		return true
	case <-t.C:
		return false
	}
}

// stop ends the child and reaps it. The caller has already closed its
// stdin. graceful gives boxrt its stdin-EOF shutdown first (Close); a link
// declared dead goes straight to SIGTERM, then SIGKILL.
func (ch *child) stop(graceful bool, timeout time.Duration) {
	if !(graceful && ch.waitExit(timeout)) && !ch.hasExited() {
		if err := ch.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			_ = ch.cmd.Process.Kill() // Windows has no SIGTERM
		}
		if !ch.waitExit(timeout) {
			_ = ch.cmd.Process.Kill()
			<-ch.exited
		}
	}
	// A sandboxed grandchild may still hold stderr; give the copier a
	// moment for the last lines, then cut it off so no goroutine remains.
	t := time.NewTimer(500 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ch.stderrDone:
	case <-t.C:
	}
	_ = ch.stderrR.Close()
	<-ch.stderrDone
}

// exitedAtStart reports whether the child exited with status 1 or 2, as
// boxrt does when it cannot start: 2 for a configuration it refuses, its
// port in use or its state directory held by another runtime, 1 for a flag
// it does not know. Starting the same command again fails the same way,
// whereas a wrapper's own status (ssh's 255) or a death by signal may not
// recur.
func (ch *child) exitedAtStart() bool {
	var ee *exec.ExitError
	return errors.As(ch.err, &ee) && (ee.ExitCode() == 1 || ee.ExitCode() == 2)
}

// exitDescription says how the child ended, and during what; with the
// end of its stderr when asked (for connect failures, where the log
// explains the exit).
func (ch *child) exitDescription(during string, withTail bool) string {
	s := fmt.Sprintf("boxrt (pid %d) exited", ch.pid())
	if during != "" {
		s += " during " + during
	}
	if ch.err != nil {
		s += ": " + ch.err.Error()
	} else {
		s += " with status 0"
	}
	if withTail {
		if t := ch.tail.String(); t != "" {
			s += " (its stderr ended with: " + t + ")"
		}
	}
	return s
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(trimLine(t.buf))
}
