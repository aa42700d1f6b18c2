package backends

import (
	"bytes"
	"encoding/json"
	"io"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// NetworkMode is what a sandbox may reach: "off", "on" (public addresses
// only, through the egress proxy) or an egress policy object
// ({"allow": [...], "deny": [...]}), held as its canonical JSON text so
// that specs stay comparable values. On the wire and in saved state it is
// the string or the object itself.
type NetworkMode string

const (
	NetworkOff NetworkMode = "off"
	NetworkOn  NetworkMode = "on"
)

// Policy parses the mode into the egress policy it stands for; field names
// the parameter in the validation error.
func (m NetworkMode) Policy(field string) (egress.Policy, error) {
	if strings.HasPrefix(string(m), "{") {
		return egress.Parse(json.RawMessage(m), field)
	}
	raw, _ := json.Marshal(string(m))
	return egress.Parse(raw, field)
}

// Egress reports whether the sandbox reaches anything: every mode but off
// goes out through the egress proxy.
func (m NetworkMode) Egress() bool { return m != NetworkOff && m != "" }

// CanonicalNetwork parses m and returns its canonical form.
func CanonicalNetwork(m NetworkMode, field string) (NetworkMode, error) {
	p, err := m.Policy(field)
	if err != nil {
		return "", err
	}
	data, _ := p.MarshalJSON()
	if p.Mode != egress.ModeRules {
		var s string
		_ = json.Unmarshal(data, &s)
		return NetworkMode(s), nil
	}
	return NetworkMode(data), nil
}

// MarshalJSON writes an object mode as the object.
func (m NetworkMode) MarshalJSON() ([]byte, error) {
	if strings.HasPrefix(string(m), "{") {
		return []byte(m), nil
	}
	return json.Marshal(string(m))
}

// UnmarshalJSON takes a string or an object (kept as compact JSON text,
// validated by CanonicalNetwork).
func (m *NetworkMode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*m = NetworkMode(s)
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil || !bytes.HasPrefix(buf.Bytes(), []byte("{")) {
		return boxerr.Validation("network", `network: use "off", "on" or {"allow": [...], "deny": [...]}`)
	}
	*m = NetworkMode(buf.String())
	return nil
}

// Isolation levels a spec may ask for. The default ("") is whatever the
// backend is configured to give every session; a stronger level is only
// honoured by a backend that lists it in Description.IsolationLevels (the
// operator's allow-list), and refused otherwise, never silently weakened.
const (
	IsolationDefault = ""
	// IsolationGVisor puts gVisor's user-space kernel between the sandbox
	// and the host kernel (docker with a runsc runtime).
	IsolationGVisor = "gvisor"
)

// MountMode is how a host directory is bound into a sandbox.
type MountMode string

const (
	MountNone MountMode = "none"
	MountRO   MountMode = "ro"
	MountRW   MountMode = "rw"
)

// Reference defaults of the sandbox fields (shared/reference §4.2).
const (
	DefaultMountPath = "/workspace"
	DefaultCPUs      = 1.0
	DefaultMemoryMB  = 512
	DefaultPidsLimit = 128
	MinMemoryMB      = 32
)

// Upper bounds of the numeric sandbox fields. Each keeps its product with
// the unit a backend needs (bytes, nanoseconds) far inside int64, so no
// value a caller may send can overflow into "no limit".
const (
	// MinCPUs is the smallest CPU share Docker accepts (NanoCPUs 1e7).
	MinCPUs = 0.01
	MaxCPUs = 1024.0
	// MaxMemoryMB is 1 TiB.
	MaxMemoryMB  = 1 << 20
	MaxPidsLimit = 1 << 22
	// MaxWorkspaceQuotaMB is 1 TiB.
	MaxWorkspaceQuotaMB = 1 << 20
	// MaxProcessMemoryMB bounds a managed process's memory_mb like a
	// session's.
	MaxProcessMemoryMB = MaxMemoryMB
)

// MountSpec is an extra bind mount of a host directory.
type MountSpec struct {
	HostPath  string    `json:"host_path"`
	MountPath string    `json:"mount_path"`
	Mode      MountMode `json:"mode"`
}

// Sandbox is what a session's sandbox is made of, as the runtime hands it
// over already validated (host paths resolved, image filled in). A backend
// persists it with the sandbox (docker: a label; bwrap: session.json), so
// the JSON keys are those of the wire and of the saved state; the runtime
// compares all but ExtraMounts to decide whether a session may be reused.
type Sandbox struct {
	Image            string      `json:"image"`
	Network          NetworkMode `json:"network"`
	HostPath         string      `json:"host_path"`
	HostPathMode     MountMode   `json:"host_path_mode"`
	MountPath        string      `json:"mount_path"`
	ExtraMounts      []MountSpec `json:"extra_mounts"`
	Persistent       bool        `json:"persistent"`
	CPUs             float64     `json:"cpus"`
	MemoryMB         int         `json:"memory_mb"`
	PidsLimit        int         `json:"pids_limit"`
	ReadOnlyRootfs   bool        `json:"read_only_rootfs"`
	WorkspaceQuotaMB int         `json:"workspace_quota_mb"`
	// Isolation is IsolationDefault or a stronger level the backend offers.
	Isolation string `json:"isolation"`
}

// MountPathOrDefault is where the workspace is mounted: MountPath, or
// DefaultMountPath for a sandbox recorded without one.
func (s Sandbox) MountPathOrDefault() string {
	if s.MountPath == "" {
		return DefaultMountPath
	}
	return s.MountPath
}

// HostWorkspace reports whether the workspace is a host directory (a
// host_path bound in a mode other than none).
func (s Sandbox) HostWorkspace() bool {
	return s.HostPath != "" && s.HostPathMode != MountNone
}

// ActiveExtraMounts returns the extra mounts a backend must bind: those whose
// mode is not none.
func (s Sandbox) ActiveExtraMounts() []MountSpec {
	var out []MountSpec
	for _, m := range s.ExtraMounts {
		if m.Mode != MountNone {
			out = append(out, m)
		}
	}
	return out
}

// RefuseEgressPolicy is for a backend without boxrt's egress proxy: a
// policy object or secrets, which only the proxy can enforce, are refused
// rather than served as "on" or "off".
func (s SandboxSpec) RefuseEgressPolicy(backend string) error {
	switch {
	case s.Network.Egress() && s.Network != NetworkOn:
		return boxerr.Validation("network", "network: the %s backend has no egress proxy to enforce a policy; use \"off\" or \"on\" (bwrap and docker take policies)", backend)
	case len(s.Secrets) > 0:
		return boxerr.Validation("secrets", "secrets: the %s backend has no egress proxy to carry them (bwrap and docker do)", backend)
	}
	return nil
}

// SandboxSpec is what StartSession gets: the sandbox of session SessionID.
type SandboxSpec struct {
	SessionID string `json:"session_id"`
	Sandbox
	// Secrets are the values the egress proxy puts into requests to their
	// hosts (the sandbox sees placeholders). They never leave boxrt's
	// memory: not persisted, not on the wire back, not in logs; a session
	// adopted by a later boxrt has none.
	Secrets []egress.Secret `json:"-"`
}

// DefaultSandboxSpec returns a SandboxSpec holding every reference default.
func DefaultSandboxSpec() SandboxSpec {
	return SandboxSpec{Sandbox: Sandbox{
		Network:        NetworkOff,
		HostPathMode:   MountRW,
		MountPath:      DefaultMountPath,
		CPUs:           DefaultCPUs,
		MemoryMB:       DefaultMemoryMB,
		PidsLimit:      DefaultPidsLimit,
		ReadOnlyRootfs: true,
	}}
}

// Session is a started sandbox as a backend knows it: what it needs to run
// commands in it, stop it and adopt it after a restart. The runtime keeps
// CreatedAt and LastUsedAt up to date; bwrap saves the whole Session in
// session.json.
type Session struct {
	SessionID        string `json:"session_id"`
	BackendName      string `json:"backend_name"`
	BackendSessionID string `json:"backend_session_id"`
	Sandbox
	CreatedAt  time.Time `json:"created_at"`
	LastUsedAt time.Time `json:"last_used_at"`
	// State is StateRunning or StateSuspended ("" reads as running).
	State string `json:"state,omitempty"`
	// Restarted: the session's sandbox was restarted since the session was
	// made or resumed (see ExitStatus.Restarted); set by the runtime.
	Restarted bool `json:"restarted,omitempty"`
}

// Session is the Session a backend reports for s: its active mounts only.
func (s SandboxSpec) Session(backend, backendSessionID string) Session {
	sb := s.Sandbox
	sb.ExtraMounts = s.ActiveExtraMounts()
	return Session{SessionID: s.SessionID, BackendName: backend, BackendSessionID: backendSessionID, Sandbox: sb}
}

// CheckMountPath validates a sandbox-side mount point and returns it
// cleaned: absolute, not the root and not inside /proc, /dev or /sys, which
// belong to the kernel (mounting over them would hide or replace what the
// backend set up there). The runtime checks every spec with it; bwrap checks
// again what it binds, as a saved session may predate a rule.
func CheckMountPath(field, p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", boxerr.Validation(field, "%s must be absolute, got %q", field, p)
	}
	if strings.ContainsRune(p, 0) {
		return "", boxerr.Validation(field, "%s must not contain NUL bytes", field)
	}
	c := path.Clean(p)
	if c == "/" {
		return "", boxerr.Validation(field, "%s must not be /, got %q", field, p)
	}
	for _, r := range []string{"/proc", "/dev", "/sys"} {
		if c == r || strings.HasPrefix(c, r+"/") {
			return "", boxerr.Validation(field, "%s must not be %s or under it, got %q", field, r, p)
		}
	}
	return c, nil
}

// ExecRequest is one command run inside a session. The backend streams the
// command's output into Stdout and Stderr as it arrives, and on Timeout (or
// ctx cancellation) kills the command's whole process tree while leaving the
// session intact.
type ExecRequest struct {
	Cmd string
	// NoLogin runs Cmd in a plain `sh -c` instead of the login shell
	// `sh -lc`, for a command that is its own login shell (E2B's
	// `bash -l -c`): the profile is read once, by it, and what only sh's
	// login reads (~/.profile beside a ~/.bash_profile) stays out, as in
	// E2B. Every exec path honours it: the session agent's and the
	// wrapper scripts of an Engine API exec or kube's exec subresource.
	NoLogin bool
	Workdir string
	Env     map[string]string
	Timeout time.Duration
	Stdout  io.Writer
	Stderr  io.Writer
	// Stdin, when not nil, is the command's standard input (nil: an empty
	// one, /dev/null). The backend copies it to the command until EOF,
	// then closes the command's stdin; it closes Stdin itself when the
	// command has ended, which is what ends a Read still pending on it.
	Stdin io.ReadCloser
	// TTY, when not nil, runs the command on a pseudo-terminal of that
	// size: stdin, stdout and stderr are the terminal, and all output
	// arrives on Stdout.
	TTY *TTYSize
	// Resize carries new terminal sizes while the command runs (TTY only).
	Resize <-chan Resize
	// Signals carries signals for the command's whole process tree while
	// it runs. SIGKILL is not sent here: cancelling ctx kills the tree.
	Signals <-chan syscall.Signal
}

// Plain reports whether r is a plain exec: no stdin, terminal, signals or
// environment of its own — what a prestarted exec (ExecPrestarter) can
// serve.
func (r ExecRequest) Plain() bool {
	return r.Stdin == nil && r.TTY == nil && r.Signals == nil && len(r.Env) == 0
}

// Resize asks a running TTY exec to change its terminal's size; the
// backend answers on Done (buffered, capacity 1) once the size is in
// effect, so that what the caller does next sees it.
type Resize struct {
	Size TTYSize
	Done chan<- error
}

// TTYSize is a terminal's size in character cells.
type TTYSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExitStatus is how a command ended. ExitCode is meaningless when TimedOut.
type ExitStatus struct {
	ExitCode int
	TimedOut bool
	// Restarted: the session's sandbox was started afresh for (or during)
	// this command because the previous one was lost (its agent died or
	// misbehaved, or a kill from the host ended it): what earlier commands
	// left running is gone, the files are kept.
	Restarted bool
	// OOMKilled: the memory limit killed a process of the session while
	// the command ran (the command itself, or another).
	OOMKilled bool
}

// ProcessSpec is a managed process (an stdio MCP server, typically).
type ProcessSpec struct {
	ProcessID string            `json:"process_id"`
	Command   string            `json:"command"`
	Args      []string          `json:"args"`
	Env       map[string]string `json:"env"`
	Cwd       string            `json:"cwd"`
	MemoryMB  int               `json:"memory_mb"`
}

// Process is a running managed process with real pipes. Signal and Kill
// reach its whole process tree.
type Process interface {
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	// Wait blocks until the process exits and returns its exit code
	// (negative signal number when killed by a signal, as the reference).
	Wait() (int, error)
	Signal(sig syscall.Signal) error
}
