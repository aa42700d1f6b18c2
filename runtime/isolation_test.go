package runtime

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
)

// proberBackend is a fake backend whose isolation can be measured.
type proberBackend struct {
	*fakeBackend
	calls   atomic.Int32
	release chan struct{}
}

func (p *proberBackend) MeasureIsolation(ctx context.Context) []backends.IsolationReport {
	p.calls.Add(1)
	select {
	case <-p.release:
	case <-ctx.Done():
	}
	return []backends.IsolationReport{{Level: "", KernelShared: true, Seccomp: "filter"}}
}

// TestBackendInfoIsolation: box_get_backend_info never waits for the
// measurement: the first answer says it is under way, a later one carries
// the reports, and the backend is measured once; box_status and box_health
// do not start it. The one-line isolation
// summary stays a string on the wire next to the measured list.
func TestBackendInfoIsolation(t *testing.T) {
	pb := &proberBackend{fakeBackend: newFake(), release: make(chan struct{})}
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	factory := func(string, Config, string, string) (backends.Backend, error) { return pb, nil }
	rt, err := New(DefaultConfig(), factory, t.TempDir(), WithClock(clock))
	require.NoError(t, err)
	rt.Start(context.Background())
	t.Cleanup(func() { _ = rt.Close(context.Background()) })

	// box_status and box_health report but never start a measurement.
	assert.False(t, rt.BackendInfo().IsolationMeasuring)
	assert.Zero(t, pb.calls.Load())

	first := rt.MeasuredBackendInfo()
	assert.True(t, first.IsolationMeasuring)
	assert.Empty(t, first.IsolationMeasured)
	raw, err := json.Marshal(first)
	require.NoError(t, err)
	var wire map[string]any
	require.NoError(t, json.Unmarshal(raw, &wire))
	assert.Equal(t, "none", wire["isolation"], "the summary is not shadowed")
	assert.Equal(t, []any{}, wire["isolation_measured"])

	close(pb.release)
	require.Eventually(t, func() bool { return !rt.MeasuredBackendInfo().IsolationMeasuring }, 5*time.Second, 10*time.Millisecond)
	got := rt.BackendInfo()
	require.Len(t, got.IsolationMeasured, 1)
	assert.True(t, got.IsolationMeasured[0].KernelShared)
	assert.Equal(t, int32(1), pb.calls.Load(), "measured once")
}
