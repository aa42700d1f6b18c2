package server

import (
	"io"
	"os"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// stdoutPipeBytes is the buffer boxrt asks for on a stdout that is a pipe:
// the most an unprivileged process may set (fs.pipe-max-size's default).
const stdoutPipeBytes = 1 << 20

// growStdoutPipe enlarges the pipe boxrt answers a stdio host on. With the
// default 64 KiB a streamed exec's notification (up to 64 KiB of output
// plus its envelope) does not fit: every chunk stalled boxrt until the host
// had read the one before, and the command behind it waited too. 1 MiB lets
// boxrt run ahead of a host that reads in bursts (streamed output of 200 MB
// took 445 ms with the default and 367 ms with it). A stdout that is not a
// pipe, or a limit that refuses (fs.pipe-user-pages-soft spent), keeps what
// it has.
func growStdoutPipe(w io.Writer, log zerolog.Logger) {
	f, ok := w.(*os.File)
	if !ok {
		return
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return
		}
		if _, err := unix.FcntlInt(fd, unix.F_SETPIPE_SZ, stdoutPipeBytes); err != nil {
			log.Debug().Err(err).Msg("stdout pipe keeps its size")
		}
	})
}
