package test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPersistentProcessesSurviveKill9: a persistent bwrap session's
// background server keeps running when boxrt is killed with SIGKILL; the
// boxrt started again on the same state directory adopts the sandbox, and
// its next command finds the process (same pid namespace) and reaches it
// on the session's loopback, without a restart.
func TestPersistentProcessesSurviveKill9(t *testing.T) {
	state := t.TempDir()
	opts := Options{Stdio: true, StateDir: state, Config: "{" + backendConfigs["bwrap"] + "}"}
	p := Start(t, opts)
	spec := func(cmd string) map[string]any {
		return map[string]any{"session_id": "survivor", "persistent": true, "cmd": cmd}
	}
	r := execIn(t, p, spec("mkdir -p /tmp/www && echo alive > /tmp/www/index.html && "+
		"(busybox httpd -f -p 127.0.0.1:8791 -h /tmp/www >/dev/null 2>&1 & echo $! > /tmp/httpd.pid) && cat /tmp/httpd.pid"))
	require.Equal(t, 0, *r.ExitCode, "%+v", r)
	pid := strings.TrimSpace(r.Stdout)
	require.NotEmpty(t, pid)

	p.Kill()

	p2 := Start(t, opts)
	var res struct {
		ExecResult
		Restarted bool `json:"restarted"`
	}
	p2.MustCall("box_exec", spec("kill -0 $(cat /tmp/httpd.pid) && cat /tmp/httpd.pid && "+
		"for i in $(seq 50); do busybox wget -q -O - http://127.0.0.1:8791/ && exit 0; sleep 0.1; done; exit 1"), &res)
	require.Equal(t, 0, *res.ExitCode, "%+v", res)
	assert.Equal(t, pid+"\nalive\n", res.Stdout, "the same process, reached on the session's loopback")
	assert.False(t, res.Restarted, "the sandbox was adopted, not restarted")
	p2.MustCall("box_delete_session", map[string]any{"session_id": "survivor"}, nil)
}
