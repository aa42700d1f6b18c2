package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Name is the backend's wire name.
const Name = "host"

// inherited are the only variables of boxrt's environment a command sees.
var inherited = []string{"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM"}

// killGrace is how long a process group gets between SIGTERM and SIGKILL
// when an exec is cancelled or times out.
const killGrace = 2 * time.Second

// Config configures the backend.
type Config struct {
	InstanceID string
	// StateDir holds the sessions' own directories (host/<instance>_<id>).
	StateDir string
}

// Backend runs sessions directly on the host.
type Backend struct {
	cfg  Config
	base string
}

// New returns the backend.
func New(cfg Config) (*Backend, error) {
	if cfg.InstanceID == "" || cfg.StateDir == "" {
		return nil, errors.New("host backend: instance id and state dir are required")
	}
	return &Backend{cfg: cfg, base: filepath.Join(cfg.StateDir, "host")}, nil
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return Name }

// Probe implements backends.Backend: a shell is all it needs.
func (b *Backend) Probe(context.Context) error {
	if _, err := exec.LookPath("sh"); err != nil {
		return fmt.Errorf("host backend: no sh on PATH: %w", err)
	}
	return os.MkdirAll(b.base, 0o700)
}

// Describe implements backends.Backend.
func (b *Backend) Describe() backends.Description {
	return backends.Description{
		EnforcedLimits: []string{},
		Isolation:      "none (unsafe direct execution on the runtime host)",
		Notes: []string{
			"unsafe_direct_execution: commands run as boxrt's own user on the runtime host; network, cpus, memory_mb, pids_limit, read_only_rootfs and workspace quotas are not enforced",
			"/workspace and extra mount paths in workdir and cwd are rewritten to host directories; absolute paths elsewhere reach the host's files",
		},
	}
}

// DefaultImage implements backends.Backend: images mean nothing here.
func (b *Backend) DefaultImage() string { return "host" }

// sessionDir is the session's own directory; hashed so any session id
// (the LangBot host's are over 100 characters) makes a short, safe name.
func (b *Backend) sessionDir(sessionID string) string {
	sum := sha256.Sum256([]byte(sessionID))
	return filepath.Join(b.base, b.cfg.InstanceID+"_"+hex.EncodeToString(sum[:])[:32])
}

// StartSession implements backends.Backend: the session's directory with
// workspace/ (unless host_path is the workspace), home/ and tmp/.
func (b *Backend) StartSession(_ context.Context, spec backends.SandboxSpec) (backends.Session, error) {
	if err := spec.RefuseEgressPolicy(Name); err != nil {
		return backends.Session{}, err
	}
	dir := b.sessionDir(spec.SessionID)
	subdirs := []string{"home", "tmp"}
	if spec.HostPath == "" {
		subdirs = append(subdirs, "workspace")
	}
	for _, d := range subdirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return backends.Session{}, boxerr.Failure("host backend: %v", err).Wrap(err)
		}
	}
	return spec.Session(Name, dir), nil
}

// Alive implements backends.Backend.
func (b *Backend) Alive(_ context.Context, info backends.Session) bool {
	fi, err := os.Stat(info.BackendSessionID)
	return err == nil && fi.IsDir()
}

// StopSession implements backends.Backend: the session's own directory
// goes; a host_path workspace stays.
func (b *Backend) StopSession(_ context.Context, info backends.Session) error {
	if filepath.Dir(info.BackendSessionID) != b.base {
		return boxerr.Failure("host backend: refusing to remove %s outside %s", info.BackendSessionID, b.base)
	}
	if err := os.RemoveAll(info.BackendSessionID); err != nil {
		return boxerr.Failure("host backend: %v", err).Wrap(err)
	}
	return nil
}

// Adopt implements backends.Backend: directories this instance left are
// removed (a restarted boxrt has no processes in them to serve).
func (b *Backend) Adopt(context.Context) ([]backends.Session, error) {
	entries, err := os.ReadDir(b.base)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), b.cfg.InstanceID+"_") {
			errs = append(errs, os.RemoveAll(filepath.Join(b.base, e.Name())))
		}
	}
	return nil, errors.Join(errs...)
}

// workspace is the host directory behind the session's mount path.
func workspace(info backends.Session) string {
	if info.HostPath != "" {
		return info.HostPath
	}
	return filepath.Join(info.BackendSessionID, "workspace")
}

// hostPath rewrites a sandbox path under the mount path or an extra
// mount's path to its host directory; other paths are kept.
func hostPath(info backends.Session, p string) string {
	mounts := append([]backends.MountSpec{{HostPath: workspace(info), MountPath: info.MountPath}}, info.ExtraMounts...)
	for _, m := range mounts {
		if p == m.MountPath {
			return m.HostPath
		}
		if rest, ok := strings.CutPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/"); ok {
			return filepath.Join(m.HostPath, rest)
		}
	}
	return p
}

// environ is the minimal environment of a command.
func environ(info backends.Session, env map[string]string) []string {
	out := make([]string, 0, len(inherited)+3+len(env))
	for _, k := range inherited {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	out = append(out, "HOME="+filepath.Join(info.BackendSessionID, "home"),
		"TMPDIR="+filepath.Join(info.BackendSessionID, "tmp"), "LANGBOT_BOX_WORKSPACE="+workspace(info))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

func command(info backends.Session, dir string, env map[string]string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = hostPath(info, dir)
	cmd.Env = environ(info, env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A background child that keeps the output pipes open must not hold
	// the exec past its shell.
	cmd.WaitDelay = time.Second
	return cmd
}

// killGroup ends a process group: SIGTERM, then SIGKILL after grace.
func killGroup(pid int, done <-chan struct{}) {
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(killGrace):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// Exec implements backends.Backend.
func (b *Backend) Exec(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	cmd := command(info, req.Workdir, req.Env, "sh", "-c", req.Cmd)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = req.Stdout, req.Stderr
	if err := cmd.Start(); err != nil {
		return backends.ExitStatus{}, boxerr.Failure("host backend: %v", err).Wrap(err)
	}
	done := make(chan struct{})
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait(); close(done) }()
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case err := <-waited:
		return exitStatus(cmd, err)
	case <-timeout:
		killGroup(cmd.Process.Pid, done)
		<-waited
		return backends.ExitStatus{TimedOut: true}, nil
	case <-ctx.Done():
		killGroup(cmd.Process.Pid, done)
		<-waited
		return backends.ExitStatus{}, ctx.Err()
	}
}

func exitStatus(cmd *exec.Cmd, err error) (backends.ExitStatus, error) {
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return backends.ExitStatus{}, boxerr.Failure("host backend: %v", err).Wrap(err)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return backends.ExitStatus{ExitCode: 128 + int(ws.Signal())}, nil
	}
	return backends.ExitStatus{ExitCode: cmd.ProcessState.ExitCode()}, nil
}

// StartProcess implements backends.Backend. The pipes are made here, not
// by exec.Cmd, whose Wait would close the read ends and lose output still
// buffered when the process exits.
func (b *Backend) StartProcess(_ context.Context, info backends.Session, spec backends.ProcessSpec) (backends.Process, error) {
	cmd := command(info, spec.Cwd, spec.Env, hostPath(info, spec.Command), spec.Args...)
	var parent, child [3]*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			if f != nil {
				_ = f.Close()
			}
		}
	}
	for i := range parent {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(parent[:])
			closeAll(child[:])
			return nil, boxerr.Failure("host backend: %v", err).Wrap(err)
		}
		if i == 0 { // stdin: the child reads
			child[i], parent[i] = r, w
		} else {
			child[i], parent[i] = w, r
		}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = child[0], child[1], child[2]
	err := cmd.Start()
	closeAll(child[:])
	if err != nil {
		closeAll(parent[:])
		return nil, boxerr.Failure("host backend: cannot start %s: %v", spec.Command, err).Wrap(err)
	}
	return &process{cmd: cmd, stdin: parent[0], stdout: &eofCloser{parent[1]}, stderr: &eofCloser{parent[2]}}, nil
}

// eofCloser closes its pipe once read to the end, so a consumer that
// drains the stream does not leak the descriptor.
type eofCloser struct{ f *os.File }

func (e *eofCloser) Read(p []byte) (int, error) {
	n, err := e.f.Read(p)
	if err != nil {
		_ = e.f.Close()
	}
	return n, err
}

// process is a managed process: its own process group.
type process struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.Reader
	stderr io.Reader
}

func (p *process) Stdin() io.WriteCloser { return p.stdin }
func (p *process) Stdout() io.Reader     { return p.stdout }
func (p *process) Stderr() io.Reader     { return p.stderr }

// Wait returns the exit code, or the negative signal number when a signal
// ended it, as the reference reports.
func (p *process) Wait() (int, error) {
	err := p.cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return -1, boxerr.Failure("host backend: %v", err).Wrap(err)
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -int(ws.Signal()), nil
	}
	return p.cmd.ProcessState.ExitCode(), nil
}

// Signal sends sig to the process's whole group.
func (p *process) Signal(sig syscall.Signal) error { return syscall.Kill(-p.cmd.Process.Pid, sig) }
