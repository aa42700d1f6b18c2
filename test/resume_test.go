package test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResumeSessionWire: box_resume_session on each durable backend
// brings a suspended session back with its workspace and its managed
// process (flagged resumed), counts one resume, answers a running session
// as it is without counting, and refuses an unknown session and bad params
// with typed errors.
func TestResumeSessionWire(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			state := t.TempDir()
			removeInstanceContainers(t, state)
			p := Start(t, Options{Stdio: true, StateDir: state, Config: "{" + durableBackends[backend].config + "}"})
			res := execIn(t, p, durableSpec(backend, "r1", map[string]any{"cmd": "echo kept > /workspace/f"}))
			require.Equal(t, 0, *res.ExitCode, "%+v", res)
			p.MustCall("box_start_managed_process", map[string]any{"session_id": "r1", "spec": map[string]any{"command": "cat"}}, nil)
			var info sessionState
			p.MustCall("box_suspend_session", map[string]any{"session_id": "r1"}, &info)
			require.Equal(t, "suspended", info.State)

			info = sessionState{}
			p.MustCall("box_resume_session", map[string]any{"session_id": "r1"}, &info)
			assert.Equal(t, "r1", info.SessionID)
			assert.Equal(t, "running", info.State, "box_resume_session answers the running session")
			var st struct {
				TotalResumed int `json:"total_resumed"`
			}
			p.MustCall("box_status", map[string]any{}, &st)
			assert.Equal(t, 1, st.TotalResumed)
			var proc struct {
				Status  string `json:"status"`
				Resumed bool   `json:"resumed"`
			}
			p.MustCall("box_get_managed_process", map[string]any{"session_id": "r1"}, &proc)
			assert.Equal(t, "running", proc.Status, "the managed process was started again")
			assert.True(t, proc.Resumed)
			res = execIn(t, p, durableSpec(backend, "r1", map[string]any{"cmd": "cat /workspace/f"}))
			assert.Equal(t, "kept\n", res.Stdout, "the workspace came back")

			// A running session is answered as it is: no second resume.
			info = sessionState{}
			p.MustCall("box_resume_session", map[string]any{"session_id": "r1"}, &info)
			assert.Equal(t, "running", info.State)
			p.MustCall("box_status", map[string]any{}, &st)
			assert.Equal(t, 1, st.TotalResumed, "resuming a running session counts nothing")

			r := p.Call("box_resume_session", map[string]any{"session_id": "nope"}, time.Minute)
			require.NotNil(t, r.Error, "resume of an unknown session succeeded: %s", r.Result)
			assert.Equal(t, "BoxSessionNotFoundError", r.Error.Type())
			r = p.Call("box_resume_session", map[string]any{}, time.Minute)
			require.NotNil(t, r.Error, "resume without session_id succeeded: %s", r.Result)
			assert.Equal(t, "BoxValidationError", r.Error.Type())
			assert.Equal(t, "session_id", r.Error.Data["field"])

			p.MustCall("box_delete_session", map[string]any{"session_id": "r1"}, nil)
			assert.Equal(t, 0, sandboxesLeft(t, backend, state))
		})
	}
}
