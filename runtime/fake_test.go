package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// fakeBackend records calls; execs run a scripted function.
type fakeBackend struct {
	mu       sync.Mutex
	started  int
	stopped  []string
	dead     map[string]bool
	adopt    []backends.Session
	execFn   func(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error)
	inFlight map[string]int
	maxPar   map[string]int
	live     bool
	specs    []backends.SandboxSpec
	execInfo []backends.Session
	levels   []string // Description.IsolationLevels
	closed   bool     // closableFake
	// beforeStart and beforeProcess, when set, run at the start of
	// StartSession and StartProcess, outside the lock (tests hold a start
	// there).
	beforeStart   func()
	beforeProcess func()
	procs         []*fakeProcess
}

func newFake() *fakeBackend {
	return &fakeBackend{dead: map[string]bool{}, inFlight: map[string]int{}, maxPar: map[string]int{}}
}

func (f *fakeBackend) Name() string                { return "fake" }
func (f *fakeBackend) Probe(context.Context) error { return nil }
func (f *fakeBackend) Describe() backends.Description {
	return backends.Description{Isolation: "none", SkillsLive: f.live, IsolationLevels: f.levels}
}
func (f *fakeBackend) DefaultImage() string                              { return "fake:latest" }
func (f *fakeBackend) Adopt(context.Context) ([]backends.Session, error) { return f.adopt, nil }

func (f *fakeBackend) StartSession(_ context.Context, spec backends.SandboxSpec) (backends.Session, error) {
	if f.beforeStart != nil {
		f.beforeStart()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started++
	f.specs = append(f.specs, spec)
	return spec.Session("fake", fmt.Sprintf("box-%d", f.started)), nil
}

func (f *fakeBackend) Alive(_ context.Context, info backends.Session) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.dead[info.BackendSessionID]
}

func (f *fakeBackend) Exec(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	f.mu.Lock()
	f.inFlight[info.SessionID]++
	f.execInfo = append(f.execInfo, info)
	if f.inFlight[info.SessionID] > f.maxPar[info.SessionID] {
		f.maxPar[info.SessionID] = f.inFlight[info.SessionID]
	}
	fn := f.execFn
	dead := f.dead[info.BackendSessionID]
	f.mu.Unlock()
	if dead {
		f.mu.Lock()
		f.inFlight[info.SessionID]--
		f.mu.Unlock()
		return backends.ExitStatus{}, boxerr.Failure("no such container %s", info.BackendSessionID)
	}
	defer func() {
		f.mu.Lock()
		f.inFlight[info.SessionID]--
		f.mu.Unlock()
	}()
	if fn != nil {
		return fn(ctx, info, req)
	}
	_, _ = io.WriteString(req.Stdout, req.Cmd)
	return backends.ExitStatus{}, nil
}

func (f *fakeBackend) StartProcess(_ context.Context, _ backends.Session, _ backends.ProcessSpec) (backends.Process, error) {
	if f.beforeProcess != nil {
		f.beforeProcess()
	}
	p := newFakeProcess()
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	return p, nil
}

// closableFake is a fakeBackend with a client to close, as the Docker
// backend has: a sandbox it is asked to stop after Close is not stopped
// (left orphaned), which the fake records.
type closableFake struct {
	*fakeBackend
}

func (c closableFake) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

func (c closableFake) StopSession(ctx context.Context, info backends.Session) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return boxerr.Failure("backend closed; cannot stop %s", info.BackendSessionID)
	}
	return c.fakeBackend.StopSession(ctx, info)
}

// orphans are the sandboxes started and never stopped.
func (f *fakeBackend) orphans() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for i := 1; i <= f.started; i++ {
		id := fmt.Sprintf("box-%d", i)
		if !slices.Contains(f.stopped, id) {
			out = append(out, id)
		}
	}
	return out
}

func (f *fakeBackend) StopSession(_ context.Context, info backends.Session) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, info.BackendSessionID)
	return nil
}

// fakeProcess is a process that echoes stdin to stdout until stdin closes
// or it is signalled.
type fakeProcess struct {
	inR, outR *io.PipeReader
	inW, outW *io.PipeWriter
	errR      *io.PipeReader
	errW      *io.PipeWriter
	done      chan struct{}
	once      sync.Once
	code      int
}

func newFakeProcess() *fakeProcess {
	p := &fakeProcess{done: make(chan struct{})}
	p.inR, p.inW = io.Pipe()
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	go func() {
		_, _ = io.Copy(p.outW, p.inR)
		p.exit(0)
	}()
	return p
}

func (p *fakeProcess) exit(code int) {
	p.once.Do(func() {
		p.code = code
		_ = p.outW.Close()
		_ = p.errW.Close()
		_ = p.inR.Close()
		close(p.done)
	})
}

func (p *fakeProcess) Stdin() io.WriteCloser { return p.inW }
func (p *fakeProcess) Stdout() io.Reader     { return p.outR }
func (p *fakeProcess) Stderr() io.Reader     { return p.errR }
func (p *fakeProcess) Wait() (int, error)    { <-p.done; return p.code, nil }
func (p *fakeProcess) Signal(sig syscall.Signal) error {
	p.exit(-int(sig))
	return nil
}

// fakeClock advances only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// NewTicker never fires: tests call Reap directly.
func (c *fakeClock) NewTicker(time.Duration) (<-chan time.Time, func()) {
	return make(chan time.Time), func() {}
}

func newTestRuntime(t *testing.T, fb backends.Backend, patch string, opts ...Option) (*Runtime, *fakeClock) {
	t.Helper()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := DefaultConfig()
	if patch != "" {
		var err error
		cfg, _, err = cfg.Merge([]byte(patch), json.Unmarshal)
		require.NoError(t, err)
	}
	factory := func(string, Config, string, string) (backends.Backend, error) { return fb, nil }
	rt, err := New(cfg, factory, t.TempDir(), append([]Option{WithClock(clock)}, opts...)...)
	require.NoError(t, err)
	rt.Start(context.Background())
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	return rt, clock
}
