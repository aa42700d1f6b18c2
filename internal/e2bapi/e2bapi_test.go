package e2bapi

import (
	"errors"
	"fmt"
	"os/exec"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process"
)

func TestShellWordRoundTrips(t *testing.T) {
	for _, s := range []string{"", "plain", "it's", `"$HOME" $(id) ; rm -rf / #`, "a\nb", `\'`} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellWord(s)).Output()
		require.NoError(t, err)
		assert.Equal(t, s, string(out))
	}
}

// TestExecLineReplacesTheShell: the program is the process the backend's
// shell was, not a child it waits for, and its words arrive unchanged.
func TestExecLineReplacesTheShell(t *testing.T) {
	line := execLine(&process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `echo "$$" "$1"`, "sh", "it's $HOME"}})
	cmd := exec.Command("sh", "-c", line)
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%d it's $HOME\n", cmd.Process.Pid), string(out))
}

func TestCommandLookup(t *testing.T) {
	sb := &sandbox{procs: map[uint32]*command{}}
	a := sb.addCommand("x1", &process.ProcessConfig{Cmd: "a"}, "")
	b := sb.addCommand("x2", &process.ProcessConfig{Cmd: "b"}, "web")
	assert.NotEqual(t, a, b)
	pid, c, ok := sb.lookup(&process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "web"}})
	require.True(t, ok)
	assert.Equal(t, b, pid)
	assert.Equal(t, "x2", c.execID)
	_, c, ok = sb.lookup(&process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: a}})
	require.True(t, ok)
	assert.Equal(t, "x1", c.execID)
	_, _, ok = sb.lookup(&process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: ""}})
	assert.False(t, ok, "an empty tag names no command")
	_, _, ok = sb.lookup(&process.ProcessSelector{})
	assert.False(t, ok)
}

func TestCommandTableIsBounded(t *testing.T) {
	sb := &sandbox{procs: map[uint32]*command{}}
	for range maxCommands * 3 {
		sb.addCommand("x", &process.ProcessConfig{Cmd: "a"}, "")
	}
	assert.LessOrEqual(t, len(sb.procs), maxCommands)
}

func TestConnectErrorCodes(t *testing.T) {
	for err, code := range map[error]connect.Code{
		boxerr.SessionNotFound("s"):           connect.CodeNotFound,
		boxerr.FileNotFound("/x"):             connect.CodeNotFound,
		boxerr.Validation("f", "bad"):         connect.CodeInvalidArgument,
		boxerr.CapacityExceeded("l", 1, "no"): connect.CodeResourceExhausted,
		boxerr.RuntimeUnavailable("later"):    connect.CodeUnavailable,
		errors.New("plain"):                   connect.CodeInternal,
	} {
		assert.Equal(t, code, connect.CodeOf(connectError(err)), "%v", err)
	}
	assert.NoError(t, connectError(nil))
}

func TestTimeoutBounds(t *testing.T) {
	d, err := timeoutOf(nil)
	require.NoError(t, err)
	assert.Equal(t, defaultTimeout, d)
	for _, bad := range []int{-1, 86401} {
		_, err := timeoutOf(&bad)
		assert.Error(t, err, bad)
	}
}

func TestRegistryRetain(t *testing.T) {
	r := newRegistry(recordStore{}, func(err error) { t.Error(err) })
	for _, id := range []string{"a", "b", "c"} {
		r.put(&sandbox{physical: id, logical: id, token: "t-" + id, procs: map[uint32]*command{}})
	}
	r.retain(map[string]bool{"b": true})
	assert.Nil(t, r.get("a"))
	assert.NotNil(t, r.get("b"))
	assert.Nil(t, r.get("c"))
	sb, known := r.find("b", "t-b")
	assert.True(t, known)
	assert.Same(t, r.get("b"), sb)
	sb, known = r.find("b", "wrong")
	assert.True(t, known)
	assert.Nil(t, sb)
	_, known = r.find("a", "t-a")
	assert.False(t, known)
}
