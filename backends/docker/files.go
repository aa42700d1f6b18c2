package docker

import (
	"context"
	"io"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/backends/internal/sandboxfs"
)

// The file API (runtime.FileSystem) is sandboxfs's, shared with the kube
// backend: one exec of its script per call, inside the container, as the
// session's user. The Engine's archive endpoints are not used: they work
// on the container's rootfs from the daemon's side, miss tmpfs mounts,
// and write files with the tar's owners. Data streams through the exec's
// stdin and stdout (stdcopy frames).

// fileSystem, embedded in Backend, gives it the FileSystem methods; an
// alias keeps the field unexported. New sets it to run on fsRunner.
type fileSystem = sandboxfs.FS

func newFileSystem(b *Backend) fileSystem { return sandboxfs.FS{Backend: Name, Runner: fsRunner{b}} }

// fsRunner runs sandboxfs's commands as Engine execs.
type fsRunner struct{ b *Backend }

// fsRun is one running exec of a sandboxfs command.
type fsRun struct {
	b      *Backend
	info   backends.Session
	id     string
	conn   io.Closer
	stdout *io.PipeReader
	stderr *execproc.LimitedBuffer
	done   chan struct{}
	err    error // of the stream, valid after done
	// fed is closed once stdin's copy has ended (at once without stdin),
	// so nobody reads the caller's reader after Wait.
	fed chan struct{}
}

// Run implements sandboxfs.Runner.
func (f fsRunner) Run(ctx context.Context, info backends.Session, stdin io.Reader, cmd []string) (sandboxfs.Run, error) {
	b := f.b
	created, err := b.cli.ContainerExecCreate(ctx, info.BackendSessionID, container.ExecOptions{
		AttachStdin:  stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
		WorkingDir:   "/",
		Cmd:          cmd,
	})
	if err != nil {
		return nil, b.sessionError(info, "file call in "+info.BackendSessionID, err)
	}
	hj, err := b.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, b.sessionError(info, "file call in "+info.BackendSessionID, err)
	}
	pr, pw := io.Pipe()
	r := &fsRun{b: b, info: info, id: created.ID, conn: hj.Conn, stdout: pr, stderr: &execproc.LimitedBuffer{Max: 4096}, done: make(chan struct{}), fed: make(chan struct{})}
	go func() {
		defer close(r.done)
		_, r.err = stdcopy.StdCopy(pw, r.stderr, hj.Reader)
		pw.CloseWithError(r.err)
	}()
	if stdin != nil {
		go func() {
			defer close(r.fed)
			// A source that fails ends the script's stdin like a finished
			// one; the caller, which sees the failure, then aborts
			// instead of committing.
			_, _ = io.Copy(hj.Conn, stdin)
			_ = hj.CloseWrite()
		}()
	} else {
		close(r.fed)
	}
	// A cancelled caller ends the exec's streams.
	stop := context.AfterFunc(ctx, func() { hj.Close() })
	go func() {
		<-r.done
		stop()
	}()
	return r, nil
}

func (r *fsRun) Stdout() io.Reader { return r.stdout }

func (r *fsRun) Cancel() { r.conn.Close() }

// Wait implements sandboxfs.Run.
func (r *fsRun) Wait() (int, string, error) {
	<-r.done
	r.conn.Close()
	<-r.fed
	if r.err != nil {
		return -1, "", r.err
	}
	ctx, cancel := cleanupContext(context.Background(), helperTimeout)
	defer cancel()
	code, err := r.b.execExitCode(ctx, r.id)
	if err != nil {
		return -1, "", r.b.sessionError(r.info, "file call result", err)
	}
	return code, r.stderr.String(), nil
}
