package kube

import (
	"context"
	"errors"
	"io"

	"k8s.io/client-go/tools/remotecommand"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/backends/internal/sandboxfs"
)

// The file API (runtime.FileSystem) is sandboxfs's, shared with the docker
// backend: one exec of its script per call through the Pod exec
// subresource, inside the sandbox container, as the Pod's user. Paths
// resolve in the container's own root (its volumes at their mount paths,
// its /tmp), so a symlink can only lead to another place in the
// Pod, never onto the node. Data streams through the exec's stdin (its
// end is the v5 protocol's close) and stdout.

// Backend embeds fileSystem (set by New) for the runtime.FileSystem
// methods, which all run on fsRunner.
type fileSystem = sandboxfs.FS

func newFileSystem(b *Backend) fileSystem {
	return sandboxfs.FS{Backend: "kube backend", Runner: fsRunner{b}}
}

// fsRunner runs sandboxfs's commands as Pod execs.
type fsRunner struct{ b *Backend }

// errCancelled ends a file call's streams on Cancel.
var errCancelled = errors.New("file call cancelled")

// fsRun is one running exec of a sandboxfs command.
type fsRun struct {
	stdout *io.PipeReader
	stdinR *io.PipeReader
	stderr *execproc.LimitedBuffer
	cancel context.CancelFunc
	done   chan struct{}
	code   int   // valid after done
	err    error // of the stream, valid after done
	// fed is closed once stdin's copy has ended, so nobody reads the
	// caller's reader after Wait (the stream does not wait for its own
	// stdin copier, which reads the pipe instead).
	fed chan struct{}
}

// Run implements sandboxfs.Runner.
func (f fsRunner) Run(ctx context.Context, info backends.Session, stdin io.Reader, cmd []string) (sandboxfs.Run, error) {
	b := f.b
	if b.configErr != nil {
		return nil, b.configErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ex, err := b.executor(info.BackendSessionID, cmd, false)
	if err != nil {
		return nil, b.apiError("preparing a file call in Pod "+info.BackendSessionID, err)
	}
	b.touch(ctx, info.BackendSessionID)
	sctx, cancel := context.WithCancel(ctx)
	outR, outW := io.Pipe()
	inR, inW := io.Pipe()
	r := &fsRun{stdout: outR, stdinR: inR, stderr: &execproc.LimitedBuffer{Max: 4096}, cancel: cancel, done: make(chan struct{}), fed: make(chan struct{})}
	go func() {
		defer close(r.fed)
		if stdin != nil {
			// A source that fails ends the script's stdin like a finished
			// one; the caller, which sees the failure, then aborts
			// instead of committing.
			_, _ = io.Copy(inW, stdin)
		}
		inW.Close()
	}()
	go func() {
		defer close(r.done)
		serr := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: r.stderr})
		r.code, r.err = exitCode(serr)
		if r.err != nil {
			r.err = b.execError(ctx, info, "file call", r.err)
		}
		outW.CloseWithError(r.err)
	}()
	return r, nil
}

func (r *fsRun) Stdout() io.Reader { return r.stdout }

// Cancel implements sandboxfs.Run.
func (r *fsRun) Cancel() {
	r.stdout.CloseWithError(errCancelled)
	r.cancel()
}

// Wait implements sandboxfs.Run.
func (r *fsRun) Wait() (int, string, error) {
	<-r.done
	r.cancel()
	// Whatever the stream left unread of stdin ends the copy.
	r.stdinR.CloseWithError(io.ErrClosedPipe)
	<-r.fed
	if r.err != nil {
		return -1, "", r.err
	}
	return r.code, r.stderr.String(), nil
}
