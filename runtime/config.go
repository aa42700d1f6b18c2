package runtime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
	"github.com/boxrt/boxrt/runtime/skills"
)

// Config is the runtime configuration, in the reference's shape: backend,
// limits, local, docker, e2b. It comes from --config, BOXRT_CONFIG (or
// LANGBOT_BOX_CONFIG) and box_init, merged key by key.
type Config struct {
	// Backend: "" or "auto" (docker when an engine answers, else bwrap),
	// "local" (same), or an explicit name.
	Backend string         `json:"backend"`
	Limits  Limits         `json:"limits"`
	Local   Local          `json:"local"`
	Docker  Docker         `json:"docker"`
	Bwrap   Bwrap          `json:"bwrap"`
	Durable Durable        `json:"durable"`
	Kube    Kube           `json:"kube"`
	E2B     map[string]any `json:"e2b,omitempty"`
	Events  EventsConfig   `json:"events"`
	Metrics MetricsConfig  `json:"metrics"`
	Egress  Egress         `json:"egress"`

	// stateDir is the state directory of the runtime the configuration
	// serves (WithStateDir): the skill store's home when local.host_root is
	// unset. It is not configuration, so not on the wire.
	stateDir string
	// egressProxy is the runtime's egress proxy, handed to the backends
	// the factory builds (EgressProxy); not configuration either.
	egressProxy *egress.Proxy
}

// EgressProxy is the egress proxy the runtime's sessions go out through;
// nil outside a runtime (the doctor's probes).
func (c Config) EgressProxy() *egress.Proxy { return c.egressProxy }

// WithStateDir returns c for a runtime whose state directory is dir, which
// then holds the skill store unless local.host_root or an absolute
// local.skills_root says otherwise.
func (c Config) WithStateDir(dir string) Config {
	c.stateDir = dir
	return c
}

// SkillStoreRoot is the skill store's directory, absolute:
// local.skills_root (default "skills"), relative to local.host_root when
// that is set, else to the state directory — or, for a configuration that
// knows none, ./data/box under the working directory, as in the reference.
func (c Config) SkillStoreRoot() string {
	base := c.Local.HostRoot
	if strings.TrimSpace(base) == "" {
		base = c.stateDir
	}
	return skills.ResolveRoot(base, c.Local.SkillsRoot)
}

// Limits are the bounded knobs. Names and ranges follow the reference;
// session_ttl_sec, max_output_bytes and the relay_* entries are boxrt's.
type Limits struct {
	MaxSessions                  int `json:"max_sessions"`
	MaxManagedProcesses          int `json:"max_managed_processes"`
	MaxCompletedProcesses        int `json:"max_completed_processes"`
	MaxAdmissionRecords          int `json:"max_admission_records"`
	MaxRPCFileBytes              int `json:"max_rpc_file_bytes"`
	CompletedProcessRetentionSec int `json:"completed_process_retention_sec"`
	SessionTTLSec                int `json:"session_ttl_sec"`
	MaxOutputBytes               int `json:"max_output_bytes"`
	// Finished background execs kept for a late box_exec_wait, attach or
	// kill, over all sessions: how many, how long, how many output bytes.
	MaxFinishedExecs         int `json:"max_finished_execs"`
	FinishedExecRetentionSec int `json:"finished_exec_retention_sec"`
	MaxFinishedExecBytes     int `json:"max_finished_exec_bytes"`
	RelayReplayLines         int `json:"relay_replay_lines"`
	RelayReplayBytes         int `json:"relay_replay_bytes"`
	// RelayLineBufferBytes bounds the unfinished stdout lines of all
	// managed processes together; a line that would grow past it is
	// dropped (the first 64 KiB of each line are not counted).
	RelayLineBufferBytes int `json:"relay_line_buffer_bytes"`
	// Skill ZIP upload limits (reference §8.5, fixed there, configurable
	// here): archive size, entry count, per-entry and total uncompressed
	// bytes, and the uncompressed/compressed ratio.
	MaxSkillZipBytes      int `json:"max_skill_zip_bytes"`
	MaxSkillZipEntries    int `json:"max_skill_zip_entries"`
	MaxSkillZipEntryBytes int `json:"max_skill_zip_entry_bytes"`
	MaxSkillZipTotalBytes int `json:"max_skill_zip_total_bytes"`
	MaxSkillZipRatio      int `json:"max_skill_zip_ratio"`
}

// Local holds host paths.
type Local struct {
	HostRoot          string     `json:"host_root"`
	DefaultWorkspace  string     `json:"default_workspace"`
	AllowedMountRoots StringList `json:"allowed_mount_roots"`
	SkillsRoot        string     `json:"skills_root"`
}

// Docker configures the docker backend.
type Docker struct {
	CPULimitEnabled FlexBool `json:"cpu_limit_enabled"`
	// Image is the default image for specs without one.
	Image string `json:"image"`
	// User: "auto" (the image's USER), or "uid[:gid]".
	User string `json:"user"`
	// ProcessUser: "" (managed processes run as the sessions' user) or
	// "uid[:gid]" to run them as another user, whose environment execs
	// then cannot read.
	ProcessUser string `json:"process_user"`
	// WorkspaceQuotaMB bounds the workspace of a session that sets no
	// workspace_quota_mb (0: unbounded).
	WorkspaceQuotaMB int `json:"workspace_quota_mb"`
	// TmpSizeMB is the size of a session's /tmp disk (kept across suspend,
	// snapshots and forks; see docs/operations.md, What a session keeps).
	TmpSizeMB int `json:"tmp_size_mb"`
	// Runtime is the engine's OCI runtime every session runs under ("" for
	// the engine's default, usually runc; "runsc" for gVisor).
	Runtime string `json:"runtime"`
	// GVisorRuntime is the engine runtime that serves sessions whose spec
	// asks for isolation "gvisor"; "" refuses such specs.
	GVisorRuntime string `json:"gvisor_runtime"`
}

// Egress configures the egress proxy every session with network goes
// out through (read at start).
type Egress struct {
	// Hosts resolves names before the host's resolver does (air-gapped
	// setups, tests): name → IPv4 address. A policy that allows the name
	// reaches the address even when it is private.
	Hosts map[string]string `json:"hosts"`
	// SecretsFile is the operator's secret store: a JSON object of
	// name → value, read on each use, that a spec's secret names with
	// {"name", "ref", "hosts"} instead of sending the value.
	SecretsFile string `json:"secrets_file"`
	// UpstreamCAFile adds PEM certificates to the roots the proxy trusts
	// when it terminates TLS for a host that carries a secret (a private
	// CA's services); the host's roots stay trusted.
	UpstreamCAFile string `json:"upstream_ca_file"`
}

// Bwrap configures the bwrap backend.
type Bwrap struct {
	// IdleReleaseSec: a session's sandbox with no call and no process of
	// its own for this long is stopped (files kept) and started again by
	// the next call; 0 keeps it running.
	IdleReleaseSec int `json:"idle_release_sec"`
}

// DefaultBwrapIdleReleaseSec is bwrap.idle_release_sec's default.
const DefaultBwrapIdleReleaseSec = 30

// Kube configures the kube backend (sessions as Pods through the API
// server). It is used only when backend is "kube": auto-selection never
// picks a cluster.
type Kube struct {
	// Kubeconfig is a kubeconfig file; "" means the in-cluster service
	// account, then $KUBECONFIG (and ~/.kube/config).
	Kubeconfig string `json:"kubeconfig"`
	// Namespace holds the session Pods; "" means the kubeconfig's (or the
	// in-cluster Pod's) namespace.
	Namespace string `json:"namespace"`
	// Instance is the id the session Pods are labelled with; replicas that
	// share it serve each other's sessions. "" means this installation's
	// instance id (state dir), which no other replica has.
	Instance        string `json:"instance"`
	Image           string `json:"image"`
	ImagePullPolicy string `json:"image_pull_policy"`
	RuntimeClass    string `json:"runtime_class"`
	StorageClass    string `json:"storage_class"`
	// WorkspaceSizeMB is a persistent session's PVC size when its spec
	// sets no workspace_quota_mb.
	WorkspaceSizeMB int               `json:"workspace_size_mb"`
	NodeSelector    map[string]string `json:"node_selector"`
	Tolerations     []KubeToleration  `json:"tolerations"`
	RunAsUser       int64             `json:"run_as_user"`
	RunAsGroup      int64             `json:"run_as_group"`
	TmpSizeMB       int               `json:"tmp_size_mb"`
	// RequestPercent is the share of the CPU/memory limits a Pod requests.
	RequestPercent int `json:"request_percent"`
	// HostPathClaims maps host paths specs may name to existing PVCs.
	HostPathClaims  map[string]string `json:"host_path_claims"`
	StartTimeoutSec int               `json:"start_timeout_sec"`
}

// KubeToleration is a Pod toleration, in the Kubernetes field names.
type KubeToleration struct {
	Key               string `json:"key"`
	Operator          string `json:"operator"`
	Value             string `json:"value"`
	Effect            string `json:"effect"`
	TolerationSeconds *int64 `json:"tolerationSeconds,omitempty"`
}

// runtimeName is what dockerd accepts as a runtime name in daemon.json.
var runtimeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Docker defaults and bounds.
const (
	DefaultDockerWorkspaceQuotaMB = 1024
	DefaultDockerTmpSizeMB        = 64
	minDockerWorkspaceQuotaMB     = 16
	maxDockerTmpSizeMB            = 16 << 10
)

// DefaultConfig returns every default.
func DefaultConfig() Config {
	return Config{
		Backend: "auto",
		Limits: Limits{
			MaxSessions:                  64,
			MaxManagedProcesses:          64,
			MaxCompletedProcesses:        256,
			MaxAdmissionRecords:          100000,
			MaxRPCFileBytes:              20 << 20,
			CompletedProcessRetentionSec: 300,
			SessionTTLSec:                300,
			MaxOutputBytes:               DefaultMaxOutputBytes,
			MaxFinishedExecs:             256,
			FinishedExecRetentionSec:     600,
			MaxFinishedExecBytes:         64 << 20,
			RelayReplayLines:             4096,
			RelayReplayBytes:             4 << 20,
			RelayLineBufferBytes:         64 << 20,
			MaxSkillZipBytes:             20 << 20,
			MaxSkillZipEntries:           512,
			MaxSkillZipEntryBytes:        16 << 20,
			MaxSkillZipTotalBytes:        64 << 20,
			MaxSkillZipRatio:             100,
		},
		Local: Local{SkillsRoot: "skills"},
		Docker: Docker{CPULimitEnabled: true, Image: "boxrt-sandbox:latest", User: "auto",
			WorkspaceQuotaMB: DefaultDockerWorkspaceQuotaMB, TmpSizeMB: DefaultDockerTmpSizeMB},
		Bwrap:   Bwrap{IdleReleaseSec: DefaultBwrapIdleReleaseSec},
		Durable: defaultDurable(),
	}
}

type limitRange struct {
	name     string
	value    *int
	min, max int
}

func (l *Limits) ranges() []limitRange {
	return []limitRange{
		{"max_sessions", &l.MaxSessions, 0, 5000},
		{"max_managed_processes", &l.MaxManagedProcesses, 0, 1024},
		{"max_completed_processes", &l.MaxCompletedProcesses, 0, 10000},
		{"max_admission_records", &l.MaxAdmissionRecords, 1, 250000},
		{"max_rpc_file_bytes", &l.MaxRPCFileBytes, 1, 100 << 20},
		{"completed_process_retention_sec", &l.CompletedProcessRetentionSec, 0, 86400},
		{"session_ttl_sec", &l.SessionTTLSec, 0, 7 * 86400},
		{"max_output_bytes", &l.MaxOutputBytes, MinMaxOutputBytes, MaxMaxOutputBytes},
		{"max_finished_execs", &l.MaxFinishedExecs, 0, 10000},
		{"finished_exec_retention_sec", &l.FinishedExecRetentionSec, 0, 86400},
		{"max_finished_exec_bytes", &l.MaxFinishedExecBytes, 0, 1 << 30},
		{"relay_replay_lines", &l.RelayReplayLines, 0, 1 << 20},
		{"relay_replay_bytes", &l.RelayReplayBytes, 0, 256 << 20},
		{"relay_line_buffer_bytes", &l.RelayLineBufferBytes, 1 << 20, 16 << 30},
		{"max_skill_zip_bytes", &l.MaxSkillZipBytes, 1, 100 << 20},
		{"max_skill_zip_entries", &l.MaxSkillZipEntries, 1, 65535},
		{"max_skill_zip_entry_bytes", &l.MaxSkillZipEntryBytes, 1, 1 << 30},
		{"max_skill_zip_total_bytes", &l.MaxSkillZipTotalBytes, 1, 1 << 30},
		{"max_skill_zip_ratio", &l.MaxSkillZipRatio, 1, 10000},
	}
}

// Validate checks every value and names the first bad key.
func (c *Config) Validate() error {
	if !autoBackend(c.Backend) && !slices.Contains(BackendOrder, c.Backend) && !slices.Contains(ExplicitBackends, c.Backend) {
		return boxerr.Validation("backend", "backend must be one of auto, %s; got %q",
			strings.Join(append(slices.Clone(BackendOrder), ExplicitBackends...), ", "), c.Backend)
	}
	for _, r := range c.Limits.ranges() {
		if *r.value < r.min || *r.value > r.max {
			return boxerr.Validation("limits."+r.name, "limits.%s must be between %d and %d, got %d", r.name, r.min, r.max, *r.value)
		}
	}
	if _, err := c.mountRoots(""); err != nil {
		return err
	}
	if err := c.Durable.validate(); err != nil {
		return err
	}
	if err := c.Events.validate(); err != nil {
		return err
	}
	if _, err := egress.New(egress.Config{Hosts: c.Egress.Hosts}); err != nil {
		return err
	}
	for _, f := range []struct{ key, path string }{{"secrets_file", c.Egress.SecretsFile}, {"upstream_ca_file", c.Egress.UpstreamCAFile}} {
		if f.path != "" && !filepath.IsAbs(f.path) {
			return boxerr.Validation("egress."+f.key, "egress.%s must be an absolute path, got %q", f.key, f.path)
		}
	}
	if _, err := c.Egress.upstreamRoots(); err != nil {
		return err
	}
	if u := c.Docker.User; u != "" && u != "auto" && strings.ContainsAny(u, " \t\n") {
		return boxerr.Validation("docker.user", "docker.user must be \"auto\" or uid[:gid], got %q", u)
	}
	for _, r := range []struct{ field, v string }{{"docker.runtime", c.Docker.Runtime}, {"docker.gvisor_runtime", c.Docker.GVisorRuntime}} {
		if r.v != "" && !runtimeName.MatchString(r.v) {
			return boxerr.Validation(r.field, "%s must be a runtime name registered with the engine (letters, digits, '.', '_', '-'), got %q", r.field, r.v)
		}
	}
	if u := c.Docker.ProcessUser; strings.ContainsAny(u, " \t\n") {
		return boxerr.Validation("docker.process_user", "docker.process_user must be empty or uid[:gid], got %q", u)
	}
	if q := c.Docker.WorkspaceQuotaMB; q != 0 && (q < minDockerWorkspaceQuotaMB || q > backends.MaxWorkspaceQuotaMB) {
		return boxerr.Validation("docker.workspace_quota_mb", "docker.workspace_quota_mb must be 0 or between %d and %d, got %d",
			minDockerWorkspaceQuotaMB, backends.MaxWorkspaceQuotaMB, q)
	}
	if v := c.Bwrap.IdleReleaseSec; v < 0 || v > 86400 {
		return boxerr.Validation("bwrap.idle_release_sec", "bwrap.idle_release_sec must be between 0 (never) and 86400, got %d", v)
	}
	if t := c.Docker.TmpSizeMB; t < 1 || t > maxDockerTmpSizeMB {
		return boxerr.Validation("docker.tmp_size_mb", "docker.tmp_size_mb must be between 1 and %d, got %d", maxDockerTmpSizeMB, t)
	}
	return c.Kube.validate()
}

// validate checks what the kube backend cannot check for itself before
// it is selected; the backend checks the rest when it is built.
func (k *Kube) validate() error {
	switch k.ImagePullPolicy {
	case "", "IfNotPresent", "Always", "Never":
	default:
		return boxerr.Validation("kube.image_pull_policy", "kube.image_pull_policy must be IfNotPresent, Always or Never, got %q", k.ImagePullPolicy)
	}
	for _, f := range []struct {
		name     string
		value    int64
		min, max int64
	}{
		{"run_as_user", k.RunAsUser, 0, 1<<31 - 1},
		{"run_as_group", k.RunAsGroup, 0, 1<<31 - 1},
		{"tmp_size_mb", int64(k.TmpSizeMB), 0, maxDockerTmpSizeMB},
		{"workspace_size_mb", int64(k.WorkspaceSizeMB), 0, backends.MaxWorkspaceQuotaMB},
		{"request_percent", int64(k.RequestPercent), 0, 100},
		{"start_timeout_sec", int64(k.StartTimeoutSec), 0, 3600},
	} {
		if f.value < f.min || f.value > f.max {
			return boxerr.Validation("kube."+f.name, "kube.%s must be between %d and %d (0: the default), got %d", f.name, f.min, f.max, f.value)
		}
	}
	return nil
}

// Decoder decodes a JSON object into v. The one boxrt serves with is
// actions.DecodeParams, strict (a wrong type is a BoxValidationError naming
// the field): decoding is the method catalogue's concern, and taking it as
// an argument keeps the dependency direction main → actions → runtime.
type Decoder func(data []byte, v any) error

// Merge returns c with patch (a JSON object) merged in key by key: nested
// objects are merged, a null section changes nothing, everything else is
// replaced. Keys boxrt does not know (a LangBot host sends its whole box
// section: enabled, admission, profiles, …) are ignored and returned, so a
// host config never fails for a key that belongs to the host. The result is
// validated; on any error c is unchanged and a BoxValidationError names the
// key.
func (c Config) Merge(patch json.RawMessage, decode Decoder) (Config, []string, error) {
	trimmed := bytes.TrimSpace(patch)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return c, nil, nil
	}
	if trimmed[0] != '{' {
		return c, nil, boxerr.Validation("config", "config must be a JSON object")
	}
	var over map[string]any
	if err := json.Unmarshal(trimmed, &over); err != nil {
		return c, nil, boxerr.Validation("config", "config is not valid JSON: %v", err)
	}
	ignored := pruneUnknown(over, reflect.TypeOf(c), "")
	baseRaw, err := json.Marshal(c)
	if err != nil {
		return c, nil, err
	}
	var base map[string]any
	if err := json.Unmarshal(baseRaw, &base); err != nil {
		return c, nil, err
	}
	merged, err := json.Marshal(mergeMaps(base, over))
	if err != nil {
		return c, nil, err
	}
	next := Config{stateDir: c.stateDir}
	if err := decode(merged, &next); err != nil {
		return c, nil, err
	}
	if err := next.Validate(); err != nil {
		return c, nil, err
	}
	return next, ignored, nil
}

// pruneUnknown deletes the keys of m that t (a struct) has no JSON field
// for, recursing into struct-typed fields, and returns their dotted paths.
func pruneUnknown(m map[string]any, t reflect.Type, prefix string) []string {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			fields[name] = f.Type
		}
	}
	var ignored []string
	for k, v := range m {
		ft, ok := fields[k]
		if !ok {
			ignored = append(ignored, prefix+k)
			delete(m, k)
			continue
		}
		if sub, ok := v.(map[string]any); ok && ft.Kind() == reflect.Struct {
			ignored = append(ignored, pruneUnknown(sub, ft, prefix+k+".")...)
		}
	}
	sort.Strings(ignored)
	return ignored
}

func mergeMaps(base, over map[string]any) map[string]any {
	for k, v := range over {
		if v == nil {
			if _, isSection := base[k].(map[string]any); isSection {
				continue
			}
		}
		if sub, ok := v.(map[string]any); ok {
			if cur, ok := base[k].(map[string]any); ok {
				base[k] = mergeMaps(cur, sub)
				continue
			}
		}
		base[k] = v
	}
	return base
}

// LoadFile reads a JSON or YAML config file (YAML when the extension says so
// or the content is not JSON) and returns it as a JSON patch.
func LoadFile(path string) (json.RawMessage, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".yaml" && ext != ".yml" && json.Valid(data) {
		return data, nil
	}
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("parse config %s: %w", path, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return out, nil
}

// StringList accepts a JSON list of strings or one comma-separated string.
type StringList []string

func (l *StringList) UnmarshalJSON(b []byte) error {
	var list []string
	if err := json.Unmarshal(b, &list); err == nil {
		*l = list
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("must be a list of strings or a comma-separated string")
	}
	*l = nil
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// FlexBool accepts a boolean or the strings "true"/"false"/"1"/"0", as the
// reference's docker.cpu_limit_enabled does.
type FlexBool bool

func (f *FlexBool) UnmarshalJSON(b []byte) error {
	var v bool
	if err := json.Unmarshal(b, &v); err == nil {
		*f = FlexBool(v)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("must be a boolean")
	}
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		*f = true
	case "0", "false", "no", "off":
		*f = false
	default:
		return fmt.Errorf("must be a boolean, got %q", s)
	}
	return nil
}

// mountRoots returns the roots host paths may come from, cleaned and with
// symlinks resolved: local.allowed_mount_roots, or when that is empty the
// default workspace (local.default_workspace, relative to host_root;
// <host_root>/default when unset) if host_root is set. The reference falls
// back to host_root itself, which holds the skill store: every session could
// then rewrite the skills other sessions mount.
//
// A root is refused when it is / (in any spelling: //, /tmp/.., a symlink
// to /), when it overlaps the skill store or stateDir (bwrap sessions'
// directories, the instance id), or when it contains boxrt's own binary.
// stateDir "" skips that one check (Config.Validate does not know it).
func (c Config) mountRoots(stateDir string) ([]string, error) {
	const field = "local.allowed_mount_roots"
	roots := []string(c.Local.AllowedMountRoots)
	if len(roots) == 0 && strings.TrimSpace(c.Local.HostRoot) != "" {
		roots = []string{c.defaultWorkspace()}
	}
	type guarded struct {
		what, path string
		dir        bool // a directory: neither may contain the other
	}
	var protect []guarded
	protect = append(protect, guarded{"the skill store (local.host_root + local.skills_root)", resolvePath(c.SkillStoreRoot()), true})
	if stateDir != "" {
		protect = append(protect, guarded{"the state directory", resolvePath(stateDir), true})
	}
	if exe, err := os.Executable(); err == nil {
		protect = append(protect, guarded{"boxrt's own binary", resolvePath(exe), false})
	}
	out := make([]string, 0, len(roots))
	for _, raw := range roots {
		r := strings.TrimSpace(raw)
		if r == "" {
			return nil, boxerr.Validation(field, "%s must not contain an empty path", field)
		}
		r = resolvePath(r)
		if r == "/" {
			return nil, boxerr.Validation(field, "%s must not contain / (%q resolves to it)", field, raw).With("path", raw)
		}
		for _, p := range protect {
			if within(p.path, r) || (p.dir && within(r, p.path)) {
				return nil, boxerr.Validation(field, "%s entry %q (%s) overlaps %s %s: sessions could read or rewrite it", field, raw, r, p.what, p.path).With("path", raw)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// DefaultWorkspace is the managed workspace root LangBot's shared
// workspace probe (box_verify_shared_workspace) reads.
func (c Config) DefaultWorkspace() string { return c.defaultWorkspace() }

// defaultWorkspace is local.default_workspace made absolute: relative to
// host_root, <host_root>/default when unset.
func (c Config) defaultWorkspace() string {
	ws := expandHome(strings.TrimSpace(c.Local.DefaultWorkspace))
	host := expandHome(c.Local.HostRoot)
	switch {
	case ws == "":
		return filepath.Join(host, "default")
	case !filepath.IsAbs(ws):
		return filepath.Join(host, ws)
	}
	return ws
}

// resolvePath makes p absolute and clean and resolves the symlinks of its
// longest existing ancestor, so that two spellings of one directory compare
// equal.
func resolvePath(p string) string {
	abs, err := filepath.Abs(expandHome(p))
	if err != nil {
		return filepath.Clean(p)
	}
	if r, err := backends.ResolveExisting(abs); err == nil {
		return r
	}
	return abs
}

// within reports whether p is root or lies under it.
func within(p, root string) bool {
	return p == root || root == "/" || strings.HasPrefix(p, root+"/")
}

func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}
