package backends

import (
	"encoding/json"
	"fmt"
	"io"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/runtime/boxerr"
)

// NetworkMode says whether a sandbox may reach the network.
type NetworkMode string

const (
	NetworkOff NetworkMode = "off"
	NetworkOn  NetworkMode = "on"
)

// MountMode is how a host directory is bound into a sandbox.
type MountMode string

const (
	MountNone MountMode = "none"
	MountRO   MountMode = "ro"
	MountRW   MountMode = "rw"
)

// Reference defaults (shared/reference §4.2).
const (
	DefaultMountPath      = "/workspace"
	DefaultTimeoutSec     = 30
	DefaultCPUs           = 1.0
	DefaultMemoryMB       = 512
	DefaultPidsLimit      = 128
	MinMemoryMB           = 32
	DefaultMaxOutputBytes = 1 << 20
	MaxMaxOutputBytes     = 4 << 20
	MinMaxOutputBytes     = 1024
	MaxTimeoutSec         = 86400
	SkillsMountDir        = ".skills"
)

// Upper bounds of the numeric spec fields. Each keeps its product with the
// unit a backend needs (bytes, nanoseconds) far inside int64, so no value a
// caller may send can overflow into "no limit".
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

// SkillMount names a skill from the store to show inside the session at
// <mount_path>/.skills/<name>. Mode is ro unless the caller opts into rw.
type SkillMount struct {
	Name string    `json:"name"`
	Mode MountMode `json:"mode,omitempty"`
}

// Spec is the reference BoxSpec: what box_exec and box_create_session take.
// Fields the runtime compares for session reuse are listed in
// CompatibilityFields.
type Spec struct {
	Cmd              string            `json:"cmd"`
	Workdir          string            `json:"workdir"`
	TimeoutSec       int               `json:"timeout_sec"`
	Network          NetworkMode       `json:"network"`
	SessionID        string            `json:"session_id"`
	Env              map[string]string `json:"env"`
	Image            string            `json:"image"`
	HostPath         string            `json:"host_path"`
	HostPathMode     MountMode         `json:"host_path_mode"`
	MountPath        string            `json:"mount_path"`
	ExtraMounts      []MountSpec       `json:"extra_mounts"`
	SkillName        string            `json:"skill_name"`
	Skills           []SkillMount      `json:"skills"`
	Persistent       bool              `json:"persistent"`
	CPUs             float64           `json:"cpus"`
	MemoryMB         int               `json:"memory_mb"`
	PidsLimit        int               `json:"pids_limit"`
	ReadOnlyRootfs   bool              `json:"read_only_rootfs"`
	WorkspaceQuotaMB int               `json:"workspace_quota_mb"`
	// MaxOutputBytes caps what is kept of each output stream (0 = the
	// configured default). boxrt extension.
	MaxOutputBytes int `json:"max_output_bytes"`
}

// DefaultSpec returns a Spec holding every reference default.
func DefaultSpec() Spec {
	return Spec{
		TimeoutSec:     DefaultTimeoutSec,
		Network:        NetworkOff,
		HostPathMode:   MountRW,
		MountPath:      DefaultMountPath,
		CPUs:           DefaultCPUs,
		MemoryMB:       DefaultMemoryMB,
		PidsLimit:      DefaultPidsLimit,
		ReadOnlyRootfs: true,
	}
}

// Normalize trims, fills remaining defaults and validates the spec in place.
func (s *Spec) Normalize() error {
	s.Cmd = strings.TrimSpace(s.Cmd)
	s.SessionID = strings.TrimSpace(s.SessionID)
	s.Workdir = strings.TrimSpace(s.Workdir)
	s.Image = strings.TrimSpace(s.Image)
	s.HostPath = strings.TrimSpace(s.HostPath)
	s.MountPath = strings.TrimSpace(s.MountPath)
	s.SkillName = strings.TrimSpace(s.SkillName)
	if s.Network == "" {
		s.Network = NetworkOff
	}
	if s.HostPathMode == "" {
		s.HostPathMode = MountRW
	}
	if s.MountPath == "" {
		s.MountPath = DefaultMountPath
	}
	if s.Workdir == "" {
		s.Workdir = s.MountPath
	}
	// Checked here, reported in the order of the switch below.
	mountPath, mountPathErr := CheckMountPath("mount_path", s.MountPath)
	if mountPathErr == nil {
		s.MountPath = mountPath
	}
	switch {
	case s.SessionID == "":
		return boxerr.Validation("session_id", "session_id must not be empty")
	case strings.ContainsRune(s.SessionID, 0):
		return boxerr.Validation("session_id", "session_id must not contain NUL bytes")
	case len(s.SessionID) > 256:
		return boxerr.Validation("session_id", "session_id must be at most 256 bytes")
	case s.TimeoutSec <= 0 || s.TimeoutSec > MaxTimeoutSec:
		return boxerr.Validation("timeout_sec", "timeout_sec must be between 1 and %d, got %d", MaxTimeoutSec, s.TimeoutSec)
	case s.Network != NetworkOff && s.Network != NetworkOn:
		return boxerr.Validation("network", "network must be \"off\" or \"on\", got %q", s.Network)
	case !validMode(s.HostPathMode):
		return boxerr.Validation("host_path_mode", "host_path_mode must be \"none\", \"ro\" or \"rw\", got %q", s.HostPathMode)
	case mountPathErr != nil:
		return mountPathErr
	case !strings.HasPrefix(s.Workdir, "/"):
		return boxerr.Validation("workdir", "workdir must be absolute, got %q", s.Workdir)
	case s.HostPath != "" && !strings.HasPrefix(s.HostPath, "/"):
		return boxerr.Validation("host_path", "host_path must be absolute, got %q", s.HostPath)
	case !(s.CPUs >= MinCPUs && s.CPUs <= MaxCPUs):
		return boxerr.Validation("cpus", "cpus must be between %v and %v, got %v", MinCPUs, MaxCPUs, s.CPUs)
	case s.MemoryMB < MinMemoryMB || s.MemoryMB > MaxMemoryMB:
		return boxerr.Validation("memory_mb", "memory_mb must be between %d and %d, got %d", MinMemoryMB, MaxMemoryMB, s.MemoryMB)
	case s.PidsLimit < 1 || s.PidsLimit > MaxPidsLimit:
		return boxerr.Validation("pids_limit", "pids_limit must be between 1 and %d, got %d", MaxPidsLimit, s.PidsLimit)
	case s.WorkspaceQuotaMB < 0 || s.WorkspaceQuotaMB > MaxWorkspaceQuotaMB:
		return boxerr.Validation("workspace_quota_mb", "workspace_quota_mb must be between 0 and %d, got %d", MaxWorkspaceQuotaMB, s.WorkspaceQuotaMB)
	case s.MaxOutputBytes != 0 && (s.MaxOutputBytes < MinMaxOutputBytes || s.MaxOutputBytes > MaxMaxOutputBytes):
		return boxerr.Validation("max_output_bytes", "max_output_bytes must be between %d and %d, got %d", MinMaxOutputBytes, MaxMaxOutputBytes, s.MaxOutputBytes)
	}
	for k := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return boxerr.Validation("env", "env name %q is invalid", k)
		}
		if strings.ContainsRune(s.Env[k], 0) {
			return boxerr.Validation("env", "env value of %s contains a NUL byte", k)
		}
	}
	if s.HostPath != "" && s.HostPathMode != MountNone &&
		s.Workdir != s.MountPath && !strings.HasPrefix(s.Workdir, strings.TrimSuffix(s.MountPath, "/")+"/") {
		return boxerr.Validation("workdir", "workdir must stay under mount_path when host_path is provided")
	}
	for i := range s.ExtraMounts {
		m := &s.ExtraMounts[i]
		m.HostPath = strings.TrimSpace(m.HostPath)
		m.MountPath = strings.TrimSpace(m.MountPath)
		if m.Mode == "" {
			m.Mode = MountRW
		}
		field := fmt.Sprintf("extra_mounts[%d]", i)
		switch {
		case !strings.HasPrefix(m.HostPath, "/"):
			return boxerr.Validation(field+".host_path", "%s.host_path must be absolute, got %q", field, m.HostPath)
		case !validMode(m.Mode):
			return boxerr.Validation(field+".mode", "%s.mode must be \"none\", \"ro\" or \"rw\", got %q", field, m.Mode)
		}
		var err error
		if m.MountPath, err = CheckMountPath(field+".mount_path", m.MountPath); err != nil {
			return err
		}
		if m.Mode != MountNone && m.MountPath == s.MountPath {
			return boxerr.Validation(field+".mount_path", "%s.mount_path must differ from mount_path %s", field, s.MountPath)
		}
	}
	for i := range s.Skills {
		sk := &s.Skills[i]
		sk.Name = strings.TrimSpace(sk.Name)
		if sk.Mode == "" {
			sk.Mode = MountRO
		}
		if sk.Mode != MountRO && sk.Mode != MountRW {
			return boxerr.Validation(fmt.Sprintf("skills[%d].mode", i), "skills[%d].mode must be \"ro\" or \"rw\", got %q", i, sk.Mode)
		}
	}
	return nil
}

// CheckMountPath validates a sandbox-side mount point and returns it
// cleaned: absolute, not the root and not inside /proc, /dev or /sys, which
// belong to the kernel (mounting over them would hide or replace what the
// backend set up there). Both backends rely on it through Normalize.
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

func validMode(m MountMode) bool { return m == MountNone || m == MountRO || m == MountRW }

// ActiveExtraMounts returns the extra mounts a backend must bind: those whose
// mode is not none.
func (s Spec) ActiveExtraMounts() []MountSpec {
	var out []MountSpec
	for _, m := range s.ExtraMounts {
		if m.Mode != MountNone {
			out = append(out, m)
		}
	}
	return out
}

// SessionInfo describes a live session. The runtime owns CreatedAt and
// LastUsedAt; a backend fills the rest from the Spec it started.
type SessionInfo struct {
	SessionID        string      `json:"session_id"`
	BackendName      string      `json:"backend_name"`
	BackendSessionID string      `json:"backend_session_id"`
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
	CreatedAt        time.Time   `json:"created_at"`
	LastUsedAt       time.Time   `json:"last_used_at"`
}

// MarshalJSON writes host_path as null when unset and times in UTC, as the
// reference does.
func (i SessionInfo) MarshalJSON() ([]byte, error) {
	type plain SessionInfo
	out := struct {
		plain
		HostPath    *string     `json:"host_path"`
		ExtraMounts []MountSpec `json:"extra_mounts"`
		CreatedAt   time.Time   `json:"created_at"`
		LastUsedAt  time.Time   `json:"last_used_at"`
	}{plain: plain(i), CreatedAt: i.CreatedAt.UTC(), LastUsedAt: i.LastUsedAt.UTC(), ExtraMounts: i.ExtraMounts}
	if i.HostPath != "" {
		out.HostPath = &out.plain.HostPath
	}
	if out.ExtraMounts == nil {
		out.ExtraMounts = []MountSpec{}
	}
	return json.Marshal(out)
}

// SessionFromSpec fills the spec-derived fields of a SessionInfo.
func SessionFromSpec(backend, backendSessionID string, s Spec) SessionInfo {
	return SessionInfo{
		SessionID:        s.SessionID,
		BackendName:      backend,
		BackendSessionID: backendSessionID,
		Image:            s.Image,
		Network:          s.Network,
		HostPath:         s.HostPath,
		HostPathMode:     s.HostPathMode,
		MountPath:        s.MountPath,
		ExtraMounts:      s.ActiveExtraMounts(),
		Persistent:       s.Persistent,
		CPUs:             s.CPUs,
		MemoryMB:         s.MemoryMB,
		PidsLimit:        s.PidsLimit,
		ReadOnlyRootfs:   s.ReadOnlyRootfs,
		WorkspaceQuotaMB: s.WorkspaceQuotaMB,
	}
}

// ExecRequest is one command run inside a session. The backend streams the
// command's output into Stdout and Stderr as it arrives, and on Timeout (or
// ctx cancellation) kills the command's whole process tree while leaving the
// session intact.
type ExecRequest struct {
	Cmd     string
	Workdir string
	Env     map[string]string
	Timeout time.Duration
	Stdout  io.Writer
	Stderr  io.Writer
}

// ExitStatus is how a command ended. ExitCode is meaningless when TimedOut.
type ExitStatus struct {
	ExitCode int
	TimedOut bool
}

// Execution statuses on the wire.
const (
	StatusCompleted = "completed"
	StatusTimedOut  = "timed_out"
)

// ExecResult is the box_exec result. The byte counts are what the command
// wrote; the strings hold at most the configured cap of each stream.
type ExecResult struct {
	SessionID       string `json:"session_id"`
	BackendName     string `json:"backend_name"`
	Status          string `json:"status"`
	ExitCode        *int   `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	DurationMS      int64  `json:"duration_ms"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
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
