package server

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestGrowStdoutPipe(t *testing.T) {
	t.Run("a pipe grows to 1 MiB", func(t *testing.T) {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		defer r.Close()
		defer w.Close()
		before, err := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0)
		require.NoError(t, err)
		require.Less(t, before, stdoutPipeBytes, "a new pipe starts smaller")
		growStdoutPipe(w, zerolog.Nop())
		after, err := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0)
		require.NoError(t, err)
		assert.Equal(t, stdoutPipeBytes, after)
	})
	t.Run("a regular file is not tried", func(t *testing.T) {
		f, err := os.Create(filepath.Join(t.TempDir(), "out"))
		require.NoError(t, err)
		defer f.Close()
		// F_SETPIPE_SZ on a file fails and would be logged: only pipes
		// are tried.
		var logged bytes.Buffer
		growStdoutPipe(f, zerolog.New(&logged).Level(zerolog.DebugLevel))
		assert.Empty(t, logged.String())
	})
	t.Run("a writer that is no file is left alone", func(t *testing.T) {
		var b bytes.Buffer
		growStdoutPipe(&b, zerolog.Nop())
		assert.Zero(t, b.Len())
	})
}
