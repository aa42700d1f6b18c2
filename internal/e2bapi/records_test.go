package e2bapi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/tenant"
)

func TestRecordsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	var warnings []error
	r := newRegistry(recordStore{dir: dir}, func(err error) { warnings = append(warnings, err) })
	end := time.Now().Add(time.Hour).Round(0)
	sb := &sandbox{physical: "ws-abc-g1-s1", logical: "s1", placement: tenant.Placement{Instance: "i", Workspace: "w", Generation: 1},
		scoped: true, token: "tok", template: "base", started: time.Now().Round(0), box: backends.Sandbox{Image: "img", Persistent: true},
		envs: map[string]string{"A": "1"}, metadata: map[string]string{"k": "v"}, autoPause: true, procs: map[uint32]*command{}}
	r.put(sb)
	r.setTimeout(sb, time.Hour, end.Add(-time.Hour), func() {})
	defer r.close()

	fired := make(chan string, 2)
	back := newRegistry(recordStore{dir: dir}, func(err error) { warnings = append(warnings, err) })
	back.restore(func(sb *sandbox) func() { return func() { fired <- sb.logical } })
	defer back.close()
	got := back.get("ws-abc-g1-s1")
	require.NotNil(t, got)
	assert.Equal(t, sb.placement, got.placement)
	assert.Equal(t, []any{sb.logical, sb.scoped, sb.token, sb.template, sb.box, sb.envs, sb.metadata, sb.autoPause},
		[]any{got.logical, got.scoped, got.token, got.template, got.box, got.envs, got.metadata, got.autoPause})
	assert.True(t, got.started.Equal(sb.started))
	assert.True(t, got.deadline().Equal(end), "the timeout is restored: %v, want %v", got.deadline(), end)

	r.remove("ws-abc-g1-s1")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
	assert.Empty(t, warnings)
}

func TestRecordsRestoreExpiredAfterGrace(t *testing.T) {
	dir := t.TempDir()
	r := newRegistry(recordStore{dir: dir}, func(err error) { t.Error(err) })
	sb := &sandbox{physical: "p", logical: "p", token: "t", procs: map[uint32]*command{}}
	r.put(sb)
	r.setTimeout(sb, time.Millisecond, time.Now().Add(-time.Minute), func() {})
	r.close()

	back := newRegistry(recordStore{dir: dir}, func(err error) { t.Error(err) })
	defer back.close()
	back.restore(func(*sandbox) func() { return func() {} })
	got := back.get("p")
	require.NotNil(t, got)
	got.mu.Lock()
	armed := got.timer != nil
	got.mu.Unlock()
	assert.True(t, armed, "a timeout that passed while boxrt was down still ends the sandbox, after the grace")
}

func TestRecordsBadFilesRemoved(t *testing.T) {
	dir := t.TempDir()
	st := recordStore{dir: dir}
	good := &sandbox{physical: "good", logical: "good", token: "t", procs: map[uint32]*command{}}
	require.NoError(t, st.save(good))
	foreign := &sandbox{physical: "other", logical: "other", token: "t", procs: map[uint32]*command{}}
	require.NoError(t, st.save(foreign))
	// A record under another sandbox's name.
	require.NoError(t, os.Rename(st.fileOf("other"), filepath.Join(dir, "0000.json")))
	for name, content := range map[string]string{
		"torn.json":    `{"physical":"x","log`,
		"unknown.json": `{"physical":"y","logical":"y","token":"t","extra":1}`,
		"empty.json":   `{"physical":"z"}`,
		"huge.json":    `{"physical":"` + strings.Repeat("a", maxRecordBytes+10) + `"}`,
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x.json.tmp-123"), []byte("partial"), 0o600))
	recs, problems := st.load()
	require.Len(t, recs, 1)
	assert.Equal(t, "good", recs[0].Physical)
	assert.Len(t, problems, 5)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	assert.Equal(t, []string{filepath.Base(st.fileOf("good"))}, left, "bad records and a cut-short write's temporary file are removed")
}
