package backendtest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// OutputDrain checks what becomes of an exec's output after the command
// exits: what it wrote before reaches a caller that takes it slower than
// any grace the backend gives a background holder of the pipe (a
// streaming client on a loaded host), and a background process that keeps
// writing to the output does not hold the exec open.
func OutputDrain(t *testing.T, env Env) {
	t.Helper()
	info := Start(t, env.Backend, env.Spec("drain"))
	if env.Ready != nil {
		env.Ready(t, info)
	}
	cases := []struct {
		name    string
		cmd     string
		pause   time.Duration // before each write to the caller
		wantMin int64
		exact   bool
	}{
		// 256 KiB in 32 KiB writes: the pipe's 64 KiB and the copy's
		// buffer are still to go when the command exits, 1.2 s and more
		// after it.
		{name: "slow caller gets every byte", cmd: "head -c 262144 /dev/zero", pause: 600 * time.Millisecond, wantMin: 256 << 10, exact: true},
		{name: "background writer", cmd: "yes & echo started", pause: time.Millisecond, wantMin: int64(len("started\n"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := &slowWriter{pause: tc.pause}
			start := time.Now()
			st, err := env.Backend.Exec(context.Background(), info, backends.ExecRequest{Cmd: tc.cmd, Timeout: time.Minute, Stdout: out})
			took := time.Since(start)
			if err != nil || st.ExitCode != 0 {
				t.Fatalf("err=%v status=%+v", err, st)
			}
			n := out.n.Load()
			if n < tc.wantMin || tc.exact && n != tc.wantMin || took > 20*time.Second {
				t.Fatalf("stdout %d bytes in %v (want %d)", n, took, tc.wantMin)
			}
		})
	}
}

// slowWriter counts what it is given, pausing before each write.
type slowWriter struct {
	pause time.Duration
	n     atomic.Int64
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(w.pause)
	w.n.Add(int64(len(p)))
	return len(p), nil
}
