package runtime

import (
	"context"
	"errors"
	goruntime "runtime"
	"sync"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Many sessions go at once at boxrt's exit, at box_shutdown and when the
// warm pools drain. One after another, 300 bwrap sessions took 17 s (the
// kernel tears each sandbox down, and a host gives an exiting child a few
// seconds); all at once, one goroutine per session, they would be as many
// goroutines and as many engine calls in flight. So what can be done for
// all of them in one pass is (their execs and managed processes stopped,
// their sandboxes killed: backends.SandboxKiller), and the rest of each
// destroy runs a few per CPU.

// teardownParallelism bounds the sessions destroyed at once: a destroy
// mostly waits (for the kernel, for the engine), so a few per CPU keep
// the CPUs busy.
func teardownParallelism() int { return 4 * goruntime.GOMAXPROCS(0) }

// eachBounded calls fn for every item, teardownParallelism at a time, and
// returns once all calls have.
func eachBounded[T any](items []T, fn func(T)) {
	var wg sync.WaitGroup
	slots := make(chan struct{}, teardownParallelism())
	for _, it := range items {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			fn(it)
		}()
	}
	wg.Wait()
}

// killSandboxes ends what the sandboxes of infos run, at once, when the
// backend can (backends.SandboxKiller); their StopSession follows.
func killSandboxes(ctx context.Context, b backends.Backend, infos []backends.Session) {
	if k, ok := b.(backends.SandboxKiller); ok && len(infos) > 0 {
		k.KillSandboxes(ctx, infos)
	}
}

// destroyWhere destroys the sessions that match. Before any destroy, for
// all of them at once: their running box_execs are interrupted (their
// callers get BoxSessionNotFoundError, reason deleted, as with a delete),
// their background execs stopped, their managed processes terminated
// (SIGTERM, then SIGKILL after the grace), and their sandboxes killed.
// Then each is destroyed as a delete does, teardownParallelism at a time.
func (r *Runtime) destroyWhere(ctx context.Context, match func(*session) bool, reason string) error {
	doomed, infos := r.sessions.interruptWhere(match)
	if len(doomed) == 0 {
		return nil
	}
	set := make(map[*session]bool, len(doomed))
	var procs []*managedProcess
	for _, s := range doomed {
		set[s] = true
		procs = append(procs, r.procs.table.takeSession(s)...)
	}
	r.execs.stop(func(x *liveExec) bool { return set[x.s] }, errDeleted)
	r.procs.terminateAll(ctx, procs)
	killSandboxes(ctx, r.backends.current(), infos)

	var mu sync.Mutex
	var errs []error
	eachBounded(infos, func(info backends.Session) {
		if err := r.deleteSession(ctx, info.SessionID); err != nil && !errors.Is(err, boxerr.ErrSessionNotFound) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	r.log.Info().Int("sessions", len(doomed)).Str("reason", reason).Msg("destroyed sessions")
	return errors.Join(errs...)
}
