package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// Reference defaults and bounds of the spec fields a backend never sees
// (shared/reference §4.2); those of the sandbox fields are backends'.
const (
	DefaultTimeoutSec     = 30
	MaxTimeoutSec         = 86400
	DefaultMaxOutputBytes = 1 << 20
	MaxMaxOutputBytes     = 4 << 20
	MinMaxOutputBytes     = 1024
	// SkillsMountDir holds the skill mounts under mount_path.
	SkillsMountDir = ".skills"
)

// SkillMount names a skill from the store to show inside the session at
// <mount_path>/.skills/<name>. Mode is ro unless the caller opts into rw.
type SkillMount struct {
	Name string             `json:"name"`
	Mode backends.MountMode `json:"mode,omitempty"`
}

// Spec is the reference BoxSpec: what box_exec and box_create_session take.
// The embedded SandboxSpec is what the backend gets; compatibilityFields
// names the fields compared for session reuse.
type Spec struct {
	backends.SandboxSpec
	Cmd        string            `json:"cmd"`
	Workdir    string            `json:"workdir"`
	TimeoutSec int               `json:"timeout_sec"`
	Env        map[string]string `json:"env"`
	SkillName  string            `json:"skill_name"`
	Skills     []SkillMount      `json:"skills"`
	// MaxOutputBytes caps what is kept of each output stream (0 = the
	// configured default). boxrt extension.
	MaxOutputBytes int `json:"max_output_bytes"`
	// NoLogin is backends.ExecRequest's: set by E2B's envd, whose
	// commands are their own login shells; not on the wire.
	NoLogin bool `json:"-"`
	// FromSnapshot creates a missing session from a stored snapshot: its
	// sandbox fields and files (a session that exists ignores it).
	FromSnapshot string `json:"from_snapshot"`
	// SecretParams are the session's secrets (egress: placeholders in the
	// sandbox, values put into requests to their hosts by the proxy); a
	// session that exists keeps those it was made with.
	SecretParams []SecretParam `json:"secrets"`
	// restore, when set, fills a freshly started sandbox with files
	// (snapshot restore, fork) before the session is served.
	restore func(ctx context.Context, info backends.Session) error
}

// SecretParam is one of a spec's secrets: its value, or ref, the name of
// an entry in the operator's secret store (egress.secrets_file), so the
// value need not travel over the wire.
type SecretParam struct {
	Name  string   `json:"name"`
	Value string   `json:"value,omitempty"`
	Ref   string   `json:"ref,omitempty"`
	Hosts []string `json:"hosts"`
	Query bool     `json:"query,omitempty"`
}

// DefaultSpec returns a Spec holding every reference default.
func DefaultSpec() Spec {
	return Spec{SandboxSpec: backends.DefaultSandboxSpec(), TimeoutSec: DefaultTimeoutSec}
}

// Normalize trims, fills remaining defaults and validates the spec in place.
// Errors come in a fixed order (fields, env, extra mounts, skills): a host
// fixing one field at a time meets them the same way on every call.
func (s *Spec) Normalize() error {
	s.fillDefaults()
	if err := s.checkFields(); err != nil {
		return err
	}
	if err := s.checkEnv(); err != nil {
		return err
	}
	if err := s.checkSecrets(); err != nil {
		return err
	}
	if s.HostPath != "" && s.HostPathMode != backends.MountNone &&
		s.Workdir != s.MountPath && !strings.HasPrefix(s.Workdir, strings.TrimSuffix(s.MountPath, "/")+"/") {
		return boxerr.Validation("workdir", "workdir must stay under mount_path when host_path is provided")
	}
	if err := s.normalizeExtraMounts(); err != nil {
		return err
	}
	return s.normalizeSkills()
}

// fillDefaults trims the string fields and fills the defaults.
func (s *Spec) fillDefaults() {
	s.Cmd = strings.TrimSpace(s.Cmd)
	s.SessionID = strings.TrimSpace(s.SessionID)
	s.Workdir = strings.TrimSpace(s.Workdir)
	s.Image = strings.TrimSpace(s.Image)
	s.HostPath = strings.TrimSpace(s.HostPath)
	s.MountPath = strings.TrimSpace(s.MountPath)
	s.SkillName = strings.TrimSpace(s.SkillName)
	s.FromSnapshot = strings.TrimSpace(s.FromSnapshot)
	s.Isolation = strings.TrimSpace(s.Isolation)
	if s.Network == "" {
		s.Network = backends.NetworkOff
	}
	if s.HostPathMode == "" {
		s.HostPathMode = backends.MountRW
	}
	if s.MountPath == "" {
		s.MountPath = backends.DefaultMountPath
	}
	if s.Workdir == "" {
		s.Workdir = s.MountPath
	}
}

// checkFields validates the scalar fields, cleaning mount_path.
func (s *Spec) checkFields() error {
	// Checked here, reported in the order of the switch below.
	mountPath, mountPathErr := backends.CheckMountPath("mount_path", s.MountPath)
	if mountPathErr == nil {
		s.MountPath = mountPath
	}
	network, networkErr := backends.CanonicalNetwork(s.Network, "network")
	if networkErr == nil {
		s.Network = network
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
	case networkErr != nil:
		return networkErr
	case !validMode(s.HostPathMode):
		return boxerr.Validation("host_path_mode", "host_path_mode must be \"none\", \"ro\" or \"rw\", got %q", s.HostPathMode)
	case mountPathErr != nil:
		return mountPathErr
	case !strings.HasPrefix(s.Workdir, "/"):
		return boxerr.Validation("workdir", "workdir must be absolute, got %q", s.Workdir)
	case s.HostPath != "" && !strings.HasPrefix(s.HostPath, "/"):
		return boxerr.Validation("host_path", "host_path must be absolute, got %q", s.HostPath)
	}
	return s.checkLimits()
}

// checkLimits validates the resource fields.
func (s *Spec) checkLimits() error {
	switch {
	case !(s.CPUs >= backends.MinCPUs && s.CPUs <= backends.MaxCPUs):
		return boxerr.Validation("cpus", "cpus must be between %v and %v, got %v", backends.MinCPUs, backends.MaxCPUs, s.CPUs)
	case s.MemoryMB < backends.MinMemoryMB || s.MemoryMB > backends.MaxMemoryMB:
		return boxerr.Validation("memory_mb", "memory_mb must be between %d and %d, got %d", backends.MinMemoryMB, backends.MaxMemoryMB, s.MemoryMB)
	case s.PidsLimit < 1 || s.PidsLimit > backends.MaxPidsLimit:
		return boxerr.Validation("pids_limit", "pids_limit must be between 1 and %d, got %d", backends.MaxPidsLimit, s.PidsLimit)
	case s.WorkspaceQuotaMB < 0 || s.WorkspaceQuotaMB > backends.MaxWorkspaceQuotaMB:
		return boxerr.Validation("workspace_quota_mb", "workspace_quota_mb must be between 0 and %d, got %d", backends.MaxWorkspaceQuotaMB, s.WorkspaceQuotaMB)
	case s.Isolation != backends.IsolationDefault && s.Isolation != backends.IsolationGVisor:
		return boxerr.Validation("isolation", "isolation must be omitted or \"gvisor\", got %q", s.Isolation)
	case s.MaxOutputBytes != 0 && (s.MaxOutputBytes < MinMaxOutputBytes || s.MaxOutputBytes > MaxMaxOutputBytes):
		return boxerr.Validation("max_output_bytes", "max_output_bytes must be between %d and %d, got %d", MinMaxOutputBytes, MaxMaxOutputBytes, s.MaxOutputBytes)
	}
	return nil
}

// checkSecrets validates the secrets' names and hosts (a ref's value is
// checked when the store is read, at the session's creation).
func (s *Spec) checkSecrets() error {
	if len(s.SecretParams) == 0 {
		return nil
	}
	if !s.Network.Egress() {
		return boxerr.Validation("secrets", "secrets need network: the egress proxy carries them to their hosts; set network to a policy that allows those hosts")
	}
	list := make([]egress.Secret, len(s.SecretParams))
	for i, p := range s.SecretParams {
		if (p.Value == "") == (p.Ref == "") {
			return boxerr.Validation(fmt.Sprintf("secrets[%d]", i), "secrets[%d]: give exactly one of value and ref", i)
		}
		list[i] = egress.Secret{Name: p.Name, Value: p.Value, Hosts: p.Hosts, Query: p.Query}
		if p.Ref != "" {
			list[i].Value = "ref"
		}
	}
	return egress.ValidateSecrets(list, "secrets")
}

func (s *Spec) checkEnv() error {
	for k := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return boxerr.Validation("env", "env name %q is invalid", k)
		}
		if strings.ContainsRune(s.Env[k], 0) {
			return boxerr.Validation("env", "env value of %s contains a NUL byte", k)
		}
	}
	return nil
}

func (s *Spec) normalizeExtraMounts() error {
	for i := range s.ExtraMounts {
		m := &s.ExtraMounts[i]
		m.HostPath = strings.TrimSpace(m.HostPath)
		m.MountPath = strings.TrimSpace(m.MountPath)
		if m.Mode == "" {
			m.Mode = backends.MountRW
		}
		field := fmt.Sprintf("extra_mounts[%d]", i)
		switch {
		case !strings.HasPrefix(m.HostPath, "/"):
			return boxerr.Validation(field+".host_path", "%s.host_path must be absolute, got %q", field, m.HostPath)
		case !validMode(m.Mode):
			return boxerr.Validation(field+".mode", "%s.mode must be \"none\", \"ro\" or \"rw\", got %q", field, m.Mode)
		}
		var err error
		if m.MountPath, err = backends.CheckMountPath(field+".mount_path", m.MountPath); err != nil {
			return err
		}
		if m.Mode != backends.MountNone && m.MountPath == s.MountPath {
			return boxerr.Validation(field+".mount_path", "%s.mount_path must differ from mount_path %s", field, s.MountPath)
		}
	}
	return nil
}

func (s *Spec) normalizeSkills() error {
	for i := range s.Skills {
		sk := &s.Skills[i]
		sk.Name = strings.TrimSpace(sk.Name)
		if sk.Mode == "" {
			sk.Mode = backends.MountRO
		}
		if sk.Mode != backends.MountRO && sk.Mode != backends.MountRW {
			return boxerr.Validation(fmt.Sprintf("skills[%d].mode", i), "skills[%d].mode must be \"ro\" or \"rw\", got %q", i, sk.Mode)
		}
	}
	return nil
}

func validMode(m backends.MountMode) bool {
	return m == backends.MountNone || m == backends.MountRO || m == backends.MountRW
}

// compatibilityFields are the fields a reused session must match, in the
// reference's order: a BoxSessionConflictError names the first that
// differs. It is the one list of them: each names a backends.Sandbox field
// by its JSON key, so SessionInfo shows it and the backends persist it with
// the sandbox; TestCompatibilityFields holds docs/protocol.md and
// docs/operations.md to it.
var compatibilityFields = sandboxFields("network", "image", "host_path", "host_path_mode", "mount_path",
	"persistent", "cpus", "memory_mb", "pids_limit", "read_only_rootfs", "workspace_quota_mb", "isolation")

type sandboxField struct {
	name  string
	index int
}

// sandboxFields finds the backends.Sandbox fields with these JSON keys; a
// key it lacks is a programming error, caught when the package loads.
func sandboxFields(names ...string) []sandboxField {
	t := reflect.TypeFor[backends.Sandbox]()
	index := map[string]int{}
	for i := range t.NumField() {
		key, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		index[key] = i
	}
	out := make([]sandboxField, len(names))
	for i, n := range names {
		j, ok := index[n]
		if !ok {
			panic("runtime: backends.Sandbox has no field " + n)
		}
		out[i] = sandboxField{name: n, index: j}
	}
	return out
}

// compatibility returns the first compatibility field whose values differ,
// printed as the reference prints them.
func compatibility(have, want backends.Sandbox) (field string, existing, requested any) {
	a, b := reflect.ValueOf(have), reflect.ValueOf(want)
	for _, f := range compatibilityFields {
		x, y := a.Field(f.index).Interface(), b.Field(f.index).Interface()
		if x != y {
			return f.name, printable(x), printable(y)
		}
	}
	return "", nil, nil
}

func printable(v any) any {
	if s, ok := v.(string); ok && s == "" {
		return "None"
	}
	if b, ok := v.(bool); ok { // the reference prints Python booleans
		if b {
			return "True"
		}
		return "False"
	}
	if f, ok := v.(float64); ok {
		return fmt.Sprintf("%.1f", f)
	}
	return v
}

// SessionInfo is a session as the host sees it (box_create_session,
// box_get_session, box_list_sessions): the backend's Session in the
// reference's JSON form.
type SessionInfo struct{ backends.Session }

// MarshalJSON writes host_path as null when unset, extra_mounts as [] when
// none, and times in UTC, as the reference does; state is always present
// (running or suspended).
func (i SessionInfo) MarshalJSON() ([]byte, error) {
	type plain backends.Session
	out := struct {
		plain
		HostPath    *string              `json:"host_path"`
		ExtraMounts []backends.MountSpec `json:"extra_mounts"`
		CreatedAt   time.Time            `json:"created_at"`
		LastUsedAt  time.Time            `json:"last_used_at"`
		State       string               `json:"state"`
	}{plain: plain(i.Session), CreatedAt: i.CreatedAt.UTC(), LastUsedAt: i.LastUsedAt.UTC(), ExtraMounts: i.ExtraMounts,
		State: i.State}
	if i.HostPath != "" {
		out.HostPath = &out.plain.HostPath
	}
	if out.ExtraMounts == nil {
		out.ExtraMounts = []backends.MountSpec{}
	}
	if out.State == "" {
		out.State = backends.StateRunning
	}
	return json.Marshal(out)
}
