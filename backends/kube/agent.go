package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// The session agent in a Pod: the container's main process waits for the
// agent's binary to appear in an emptyDir of boxrt's own and then becomes
// it ("boxrt agent --listen"). boxrt uploads its static binary through one
// exec, checked by running it (--version) before it is moved into place,
// and reaches the agent through one long-lived exec per Pod of "boxrt
// agent --bridge", whose stdin and stdout carry the protocol's stream mode.
// Commands then cost a frame each way instead of an exec each.
const (
	agentVolume = "boxrt-agent"
	agentDir    = "/run/boxrt-agent"
	agentBin    = agentDir + "/boxrt"
	agentSock   = agentDir + "/agent.sock"
	// agentUploadTimeout bounds the upload of the binary (tens of MB).
	agentUploadTimeout = 2 * time.Minute
	// agentRestartTimeout bounds the wait for a lost agent: the kubelet
	// restarting its container (after a back-off from the second time on).
	agentRestartTimeout = 90 * time.Second
)

// agentMain is the container's main process of a Pod with an agent: the
// keep-alive loop until the binary is in place, then the agent. A sleep
// that takes no fraction (POSIX's) only makes the wait coarser.
const agentMain = `trap "exit 0" TERM
while :; do
	[ -x ` + agentBin + ` ] && exec ` + agentBin + ` agent --listen ` + agentSock + `
	sleep 0.2 2>/dev/null || sleep 1
done`

// mainCommand is the container's main process.
func (b *Backend) mainCommand() []string {
	if b.cfg.AgentBinary == "" {
		return []string{"sh", "-c", sandboxsh.KeepAlive}
	}
	return []string{"sh", "-c", agentMain}
}

func (b *Backend) restartPolicy() corev1.RestartPolicy {
	if b.cfg.AgentBinary == "" {
		return corev1.RestartPolicyNever
	}
	return corev1.RestartPolicyAlways
}

// agentVolumeSource is on the node's disk, not in memory: the binary
// would count against the Pod's memory limit there.
func agentVolumeSource() corev1.Volume {
	size := resource.MustParse("256Mi")
	return corev1.Volume{Name: agentVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size}}}
}

// podAgent is the agent of one Pod as boxrt reaches it.
type podAgent struct {
	mu     sync.Mutex
	conn   *sandboxagent.Conn
	cancel context.CancelFunc // cuts the bridge's exec
	ended  <-chan error       // the bridge's exec has ended
	off    error              // why the Pod runs its commands by exec instead
	// pid is the agent's last seen: another one after a lost connection
	// is a restarted container.
	pid int
	// warming: warmAgent is bringing the agent up.
	warming atomic.Bool
	// restartSaid: killSessionUser's result reported the restart the
	// next connection finds.
	restartSaid atomic.Bool
}

// podAgentOf is pod's podAgent, made on first use.
func (b *Backend) podAgentOf(pod string) *podAgent {
	v, _ := b.agents.LoadOrStore(pod, &podAgent{})
	return v.(*podAgent)
}

// agentNote is Describe's line on how commands run.
func (b *Backend) agentNote() string {
	if b.cfg.AgentBinary == "" {
		return "commands run as one Pod exec each (no session agent binary configured)"
	}
	return "commands run through the session agent in the Pod (boxrt's binary, uploaded once per Pod) over one long-lived exec; a Pod where the agent cannot run (its upload or start fails) runs them as one exec each, and a Pod whose agent died has its container restarted (files kept, processes gone: the next command says restarted)"
}

// usesAgent says whether pod's commands go through its agent: the backend
// has a binary and the Pod has the agent's volume (not one an earlier
// boxrt made).
func (b *Backend) usesAgent(pod string) bool {
	if b.cfg.AgentBinary == "" {
		return false
	}
	_, noAgent := b.noAgent.Load(pod)
	return !noAgent
}

// agentConn returns the connection to pod's agent, uploading the binary
// and opening the bridge when there is none. After a lost connection it
// waits for the agent (the container restarting) and says whether it is
// another one: restarted. An errNoAgent means the Pod runs its commands
// by exec (the error says why).
func (b *Backend) agentConn(ctx context.Context, pod string) (conn *sandboxagent.Conn, restarted bool, err error) {
	return b.connect(ctx, pod, b.podAgentOf(pod))
}

func (b *Backend) connect(ctx context.Context, pod string, pa *podAgent) (conn *sandboxagent.Conn, restarted bool, err error) {
	pa.mu.Lock()
	defer pa.mu.Unlock()
	if pa.off != nil {
		return nil, false, pa.off
	}
	if pa.conn != nil {
		select {
		case <-pa.conn.Done():
			pa.close()
		default:
			return pa.conn, false, nil
		}
	}
	if pa.pid != 0 {
		return b.reopenBridge(ctx, pod, pa)
	}
	err = b.openBridge(ctx, pod, pa)
	if err != nil {
		// The binary is not there yet (a new Pod, or a boxrt that
		// adopted it): upload it, then try once more.
		if err = b.uploadAgent(ctx, pod); err == nil {
			err = b.openBridge(ctx, pod, pa)
		}
	}
	if err != nil && ctx.Err() == nil {
		pa.off = &noAgentError{pod: pod, err: err}
		return nil, false, pa.off
	}
	return pa.conn, false, err
}

// reopenBridge reaches pod's agent again after its connection was lost:
// the bridge's exec broke (the same agent answers), or the agent died
// and its container is being restarted (another one answers, once the
// kubelet has started it: restarted).
func (b *Backend) reopenBridge(ctx context.Context, pod string, pa *podAgent) (*sandboxagent.Conn, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, agentRestartTimeout)
	defer cancel()
	before := pa.pid
	for {
		err := b.openBridge(ctx, pod, pa)
		if err != nil && b.uploadAgent(ctx, pod) == nil {
			// A Pod made again under the same name (another replica's
			// resume) has no binary yet.
			err = b.openBridge(ctx, pod, pa)
		}
		if err == nil {
			// The Pods' processes share a pid namespace: another agent
			// has another pid.
			return pa.conn, pa.pid != before && !pa.restartSaid.Swap(false), nil
		}
		select {
		case <-ctx.Done():
			return nil, false, boxerr.Failure("kube backend: the session agent of Pod %s did not come back within %s: %v", pod, agentRestartTimeout, err).Wrap(err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// noAgentError is why a Pod's commands run as execs of their own.
type noAgentError struct {
	pod string
	err error
}

func (e *noAgentError) Error() string {
	return fmt.Sprintf("the session agent cannot run in Pod %s: %v", e.pod, e.err)
}

// close ends the bridge: closing the Conn closes the exec's stdin, the
// bridge ends and its exec with it. Cutting the stream instead (client-go)
// leaves its copiers waiting until the connection notices.
func (pa *podAgent) close() {
	if pa.conn != nil {
		pa.conn.Close()
		select {
		case <-pa.ended:
		case <-time.After(killGrace):
		}
		pa.cancel()
		pa.conn, pa.cancel, pa.ended = nil, nil, nil
	}
}

// warmAgent gets a new Pod's agent running (the upload, the bridge) in
// the background; a pooled Pod gets it at warm-up. Commands that come
// meanwhile run as execs of their own rather than wait for it (the upload
// takes longer than a cold exec). A failure leaves the Pod's commands to
// execs, as agentConn says.
func (b *Backend) warmAgent(pod string) {
	if !b.usesAgent(pod) {
		return
	}
	pa := b.podAgentOf(pod)
	pa.warming.Store(true)
	go func() {
		defer pa.warming.Store(false)
		// Not cut short by closeAgent: client-go leaves a cut stream's
		// goroutines behind; the warm-up ends when the Pod does.
		ctx, cancel := context.WithTimeout(context.Background(), agentUploadTimeout)
		defer cancel()
		_, _, _ = b.connect(ctx, pod, pa)
	}()
}

// warming says whether pod's agent is being brought up.
func (b *Backend) warming(pod string) bool {
	v, ok := b.agents.Load(pod)
	return ok && v.(*podAgent).warming.Load()
}

// closeAgent ends the bridge to pod's agent (the Pod is going away).
func (b *Backend) closeAgent(pod string) {
	if v, ok := b.agents.LoadAndDelete(pod); ok {
		pa := v.(*podAgent)
		// After a warm-up still under way, without holding up the
		// Pod's deletion.
		go func() {
			pa.mu.Lock()
			defer pa.mu.Unlock()
			pa.close()
		}()
	}
}

// openBridge runs "boxrt agent --bridge" in pod and speaks to the agent
// through it.
func (b *Backend) openBridge(ctx context.Context, pod string, pa *podAgent) error {
	ex, err := b.executor(pod, []string{agentBin, "agent", "--bridge", agentSock}, false)
	if err != nil {
		return err
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.Background())
	stderr := &execproc.LimitedBuffer{Max: 4096}
	ended := make(chan error, 1)
	go func() {
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: stderr})
		outW.Close()
		inR.Close()
		ended <- err
	}()
	conn, err := sandboxagent.Bridge(ctx, outR, inW)
	if err != nil {
		// Bridge closed the exec's stdin: the bridge ends, and its exec;
		// cutting the stream is the last resort.
		var serr error
		select {
		case serr = <-ended:
		case <-time.After(killGrace):
			cancel()
			serr = <-ended
		}
		cancel()
		if serr != nil {
			err = fmt.Errorf("%w (the bridge: %v %s)", err, serr, stderr.String())
		}
		return err
	}
	pa.conn, pa.cancel, pa.ended, pa.pid = conn, cancel, ended, conn.AgentPID()
	return nil
}

// uploadAgent copies the agent's binary into pod through one exec: to a
// temporary name, run once (--version: it is whole and runs in this
// image), then renamed into the place the container waits for.
func (b *Backend) uploadAgent(ctx context.Context, pod string) error {
	f, err := os.Open(b.cfg.AgentBinary)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(ctx, agentUploadTimeout)
	defer cancel()
	script := `set -e; t=` + agentDir + `/.boxrt.$$; trap 'rm -f "$t"' EXIT; cat >"$t"; chmod 755 "$t"; "$t" agent --version >/dev/null; mv -f "$t" ` + agentBin
	ex, err := b.executor(pod, []string{"sh", "-c", script}, false)
	if err != nil {
		return err
	}
	out := &execproc.LimitedBuffer{Max: 4096}
	code, err := exitCode(ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: f, Stdout: out, Stderr: out}))
	if err == nil && code != 0 {
		err = fmt.Errorf("upload of the agent exited %d: %s", code, out.String())
	}
	return err
}

// execAgent runs req through pod's agent. The command is a session
// leader: a signal, a timeout's kill and the kill after a box_exec_kill
// go to its process group; what it leaves running when it ends on its own
// stays (it is the session's).
func (b *Backend) execAgent(ctx context.Context, info backends.Session, req backends.ExecRequest, conn *sandboxagent.Conn, restarted bool) (backends.ExitStatus, error) {
	workdir, _ := execproc.Paths(info, req.Workdir, "exec", pidDir)
	rr := sandboxagent.RunRequest{
		Argv:       sandboxsh.AgentExecArgv(workdir, req.Cmd, req.NoLogin),
		Env:        envArgs(req.Env)[1:],
		InheritEnv: true,
		Stdout:     req.Stdout,
		Stderr:     req.Stderr,
	}
	if req.Stdin != nil {
		rr.Stdin = req.Stdin
		defer req.Stdin.Close()
	}
	if req.TTY != nil {
		rr.TTY = &sandboxagent.TermSize{Rows: req.TTY.Rows, Cols: req.TTY.Cols}
	}
	p, err := conn.Run(ctx, rr)
	if err != nil {
		return backends.ExitStatus{}, b.agentError(ctx, info, err)
	}
	defer b.touch(ctx, info.BackendSessionID)
	ended := make(chan struct{})
	var exit sandboxagent.Exit
	var werr, killErr error
	go func() {
		exit, werr = p.Wait(context.Background())
		close(ended)
	}()
	status, finished, err := execproc.Await(ctx, req, execproc.Running{
		Ended: ended,
		Resize: func(size backends.TTYSize) error {
			return p.Resize(ctx, sandboxagent.TermSize{Rows: size.Rows, Cols: size.Cols})
		},
		Signal: func(sig syscall.Signal) { _ = p.Signal(sig) },
		Kill: func() {
			_ = p.Signal(syscall.SIGKILL)
			select {
			case <-ended:
			case <-time.After(killGrace):
				if killErr = b.killSessionUser(ctx, info.BackendSessionID, ended); killErr == nil {
					restarted = true
				}
			}
		},
	})
	status.Restarted = restarted
	if killErr != nil {
		return status, boxerr.Failure("kube backend: the session agent of Pod %s did not end the command within %s, and killing the session's processes failed (%v): the command may still be running; delete the session to end it", info.BackendSessionID, killGrace, killErr).Wrap(killErr)
	}
	if !finished {
		return status, err
	}
	if werr != nil {
		return backends.ExitStatus{}, b.agentError(ctx, info, werr)
	}
	status.ExitCode = exit.Code
	return status, nil
}

// killSessionUser ends every process of the sandbox user in pod: a
// command the agent did not kill within killGrace (the agent is dead,
// stopped or lying) goes as a sandbox's cgroup goes from the host
// elsewhere. The agent goes with them, and the kubelet restarts its
// container (files kept, processes gone); the result that did it says
// restarted, so the next connection does not say it again. The kill runs
// just after its exec has ended (the container's end would cut the exec's
// stream), so it is confirmed by the agent's connection ending: conn is
// the command's wait on it. The pause container, pid 1 of the Pod's
// shared pid namespace, runs as another user and is not signalled.
func (b *Backend) killSessionUser(ctx context.Context, pod string, conn <-chan struct{}) error {
	pa := b.podAgentOf(pod)
	pa.restartSaid.Store(true)
	err := b.helper(ctx, pod, "killing the session's processes", []string{"sh", "-c", killSessionScript})
	if err == nil {
		select {
		case <-conn:
		case <-time.After(killGrace):
			err = fmt.Errorf("the agent's connection was still open %s after the kill", killGrace)
		}
	}
	if err != nil {
		pa.restartSaid.Store(false)
	}
	return err
}

// killSessionScript kills every process the sandbox user may signal, from
// a process its exec has left behind.
const killSessionScript = `(sleep 0.1 2>/dev/null || sleep 1; kill -KILL -1) </dev/null >/dev/null 2>&1 &`

// agentError is the failure of a command through the agent: a refused
// command is the caller's; a lost agent is the session's being gone when
// its Pod is, else the agent's (the next command reaches it again, or its
// restarted container and says so).
func (b *Backend) agentError(ctx context.Context, info backends.Session, err error) error {
	var se *sandboxagent.SpawnError
	if errors.As(err, &se) {
		return boxerr.Failure("kube backend: %v", se).Wrap(err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if e := b.execError(ctx, info, "running command", err); errors.Is(e, boxerr.ErrSessionNotFound) {
		return e
	}
	return boxerr.Failure("kube backend: the session agent of Pod %s was lost under the command (%v); the next command reaches it again, restarted if it died", info.BackendSessionID, err).Wrap(err)
}
