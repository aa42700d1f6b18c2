package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// loudExec prints stdoutBytes to stdout and half as much to stderr, in
// 32 KiB writes, as a chatty command would.
func loudExec(stdoutBytes int) func(context.Context, backends.Session, backends.ExecRequest) (backends.ExitStatus, error) {
	block := bytes.Repeat([]byte("0123456789abcdef"), 2048)
	return func(_ context.Context, _ backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
		for n := 0; n < stdoutBytes; n += len(block) {
			_, _ = req.Stdout.Write(block)
			if n%(2*len(block)) == 0 {
				_, _ = req.Stderr.Write(block)
			}
		}
		return backends.ExitStatus{}, nil
	}
}

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}

// runBackground starts n background execs one after the other and waits
// for each; it returns their ids.
func runBackground(t *testing.T, rt *Runtime, n int) []string {
	t.Helper()
	ctx := context.Background()
	s := spec("loud")
	s.Cmd = "loud"
	ids := make([]string, 0, n)
	for i := 0; i < n; i++ {
		info, err := rt.Execs().Start(ctx, s, ExecOptions{})
		require.NoError(t, err)
		_, err = rt.Execs().Wait(ctx, info.ExecID, 0)
		require.NoError(t, err)
		ids = append(ids, info.ExecID)
	}
	return ids
}

// TestFinishedExecsMemoryBounded: 64 finished background execs that each
// printed 2 MiB (and 1 MiB on stderr) keep, with the default limits, no
// more than limits.max_finished_exec_bytes (64 MiB) of live heap between
// them, measured after a full GC; the newest still answers
// box_exec_wait with its whole head and tail.
func TestFinishedExecsMemoryBounded(t *testing.T) {
	fb := newFake()
	fb.execFn = loudExec(2 << 20)
	rt, _ := newTestRuntime(t, fb, "")
	runBackground(t, rt, 1) // the session and the runtime's own state
	before := heapInUse()
	ids := runBackground(t, rt, 64)
	grown := int64(heapInUse()) - int64(before)
	t.Logf("live heap grew by %.1f MiB for 64 finished execs", float64(grown)/(1<<20))
	const budget = 64 << 20
	assert.Less(t, grown, int64(budget+8<<20), "finished execs keep more than limits.max_finished_exec_bytes")

	res, err := rt.Execs().Wait(context.Background(), ids[len(ids)-1], 0)
	require.NoError(t, err)
	assert.True(t, res.StdoutTruncated)
	assert.Equal(t, int64(2<<20), res.StdoutBytes)
	assert.Greater(t, len(res.Stdout), DefaultMaxOutputBytes-100, "the newest result keeps its head and tail")
}

// TestFinishedExecsLimits: count, retention and bytes of the finished
// execs kept are the limits.* keys, validated; an exec past any of them is
// a BoxValidationError with reason not_found, and a finished exec's kept
// bytes are its result and FinishedExecReplayBytes of replay at most.
func TestFinishedExecsLimits(t *testing.T) {
	fb := newFake()
	fb.execFn = loudExec(256 << 10)
	rt, clock := newTestRuntime(t, fb, `{"limits":{"max_finished_execs":4,"finished_exec_retention_sec":60,"max_finished_exec_bytes":4194304}}`)

	ids := runBackground(t, rt, 5)
	assert.True(t, forgotten(rt, ids[0]), "the fifth finished exec pushes out the first (max_finished_execs 4)")
	for _, id := range ids[1:] {
		assert.False(t, forgotten(rt, id), "exec %s is kept", id)
	}
	rt.execs.table.mu.Lock()
	kept := rt.execs.table.finishedBytes
	rt.execs.table.mu.Unlock()
	perExec := int64(256<<10+128<<10) + FinishedExecReplayBytes
	assert.LessOrEqual(t, kept, 4*perExec, "what 4 finished execs keep")
	assert.Greater(t, kept, int64(0))

	clock.Advance(61 * time.Second)
	for _, id := range ids[1:] {
		assert.True(t, forgotten(rt, id), "exec %s is forgotten after finished_exec_retention_sec", id)
	}

	rt2, _ := newTestRuntime(t, fb, `{"limits":{"max_finished_exec_bytes":1048576}}`)
	ids = runBackground(t, rt2, 4)
	assert.True(t, forgotten(rt2, ids[0]), "max_finished_exec_bytes 1 MiB keeps at most 2 of 4 execs of ~450 KiB each")
	assert.False(t, forgotten(rt2, ids[3]))

	for _, bad := range []string{`{"limits":{"max_finished_execs":-1}}`, `{"limits":{"finished_exec_retention_sec":86401}}`,
		`{"limits":{"max_finished_exec_bytes":-5}}`} {
		cfg, _, err := DefaultConfig().Merge([]byte(bad), json.Unmarshal)
		if err == nil {
			err = cfg.Validate()
		}
		assert.True(t, errors.Is(err, boxerr.ErrValidation), "%s: %v", bad, err)
	}
}

// forgotten tells whether box_exec_wait no longer knows exec id.
func forgotten(rt *Runtime, id string) bool {
	_, err := rt.Execs().Wait(context.Background(), id, 0)
	var be *boxerr.Error
	return errors.As(err, &be) && errors.Is(err, boxerr.ErrValidation) && be.Details["reason"] == "not_found"
}
