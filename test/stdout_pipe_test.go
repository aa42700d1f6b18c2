package test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// boxrt enlarges the pipe a stdio host reads it from to 1 MiB, so that a
// streamed exec's notifications (64 KiB of output plus the envelope) do not
// stall boxrt, and the command, on every chunk.
func TestStdoutPipeGrown(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: bwrapConfig})
	r := p.Call("__ping", map[string]any{}, 10*time.Second)
	require.Nil(t, r.Error, "the stdio loop serves")
	require.NotNil(t, p.stdout)
	raw, err := p.stdout.SyscallConn()
	require.NoError(t, err)
	var size int
	var sizeErr error
	require.NoError(t, raw.Control(func(fd uintptr) { size, sizeErr = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) }))
	require.NoError(t, sizeErr)
	assert.Equal(t, 1<<20, size)
}
