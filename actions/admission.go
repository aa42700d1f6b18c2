package actions

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/skills"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// admissionPolicy is the config's admission section (the reference's
// SandboxAdmissionPolicy). With Required, sandbox actions need an
// installed grant for their Workspace and execution generation, and the
// runtime owns the session id ("global").
type admissionPolicy struct {
	Required            bool    `json:"required"`
	LogicalSessionID    string  `json:"logical_session_id"`
	RequiredBackend     string  `json:"required_backend"`
	MaxSessions         int     `json:"max_sessions"`
	MaxManagedProcesses int     `json:"max_managed_processes"`
	MaxGrantTTLSec      int     `json:"max_grant_ttl_sec"`
	MaxTimeoutSec       int     `json:"max_timeout_sec"`
	CPUs                float64 `json:"cpus"`
	MemoryMB            int     `json:"memory_mb"`
	PidsLimit           int     `json:"pids_limit"`
	ReadOnlyRootfs      bool    `json:"read_only_rootfs"`
	WorkspaceQuotaMB    int     `json:"workspace_quota_mb"`
	ReadinessCacheSec   int     `json:"readiness_cache_sec"`
}

func defaultAdmissionPolicy() admissionPolicy {
	return admissionPolicy{LogicalSessionID: "global", RequiredBackend: "nsjail", MaxSessions: 1,
		MaxGrantTTLSec: 300, MaxTimeoutSec: 120, CPUs: 1, MemoryMB: 512, PidsLimit: 128, ReadOnlyRootfs: true,
		ReadinessCacheSec: 15}
}

func (p admissionPolicy) check() error {
	switch {
	case p.LogicalSessionID != "global":
		return boxerr.Validation("admission.logical_session_id", `logical_session_id must be "global"`)
	case p.RequiredBackend != "nsjail":
		return boxerr.Validation("admission.required_backend", `required_backend must be "nsjail"`)
	case p.MaxSessions < 0 || p.MaxSessions > 1:
		return boxerr.Validation("admission.max_sessions", "max_sessions must be 0 or 1")
	case p.MaxManagedProcesses != 0:
		return boxerr.Validation("admission.max_managed_processes", "max_managed_processes must be 0")
	case p.MaxGrantTTLSec <= 0 || p.MaxTimeoutSec <= 0 || p.CPUs <= 0 || p.MemoryMB < 32 || p.PidsLimit <= 0 ||
		p.WorkspaceQuotaMB < 0 || p.ReadinessCacheSec < 0:
		return boxerr.Validation("admission", "admission limits out of range")
	}
	return nil
}

// grant is an installed SandboxAdmissionGrant.
type grant struct {
	InstanceUUID        string `json:"instance_uuid"`
	WorkspaceUUID       string `json:"workspace_uuid"`
	ExecutionGeneration *int64 `json:"execution_generation"`
	EntitlementRevision *int64 `json:"entitlement_revision"`
	ExpiresAt           string `json:"expires_at"`
	MaxSessions         *int   `json:"max_sessions"`
	MaxManagedProcesses *int   `json:"max_managed_processes"`

	expires time.Time
}

func (g *grant) validate() error {
	g.InstanceUUID, g.WorkspaceUUID = strings.TrimSpace(g.InstanceUUID), strings.TrimSpace(g.WorkspaceUUID)
	switch {
	case g.InstanceUUID == "" || g.WorkspaceUUID == "":
		return boxerr.Validation("instance_uuid", "instance_uuid and workspace_uuid must not be empty")
	case g.ExecutionGeneration == nil || *g.ExecutionGeneration < 1:
		return boxerr.Validation("execution_generation", "execution_generation must be an integer >= 1")
	case g.EntitlementRevision == nil || *g.EntitlementRevision < 1:
		return boxerr.Validation("entitlement_revision", "entitlement_revision must be an integer >= 1")
	case g.MaxSessions == nil || *g.MaxSessions < 0:
		return boxerr.Validation("max_sessions", "max_sessions must be an integer >= 0")
	case g.MaxManagedProcesses == nil || *g.MaxManagedProcesses < 0:
		return boxerr.Validation("max_managed_processes", "max_managed_processes must be an integer >= 0")
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(g.ExpiresAt))
	if err != nil {
		return boxerr.Validation("expires_at", "expires_at must be an ISO-8601 datetime that includes a timezone")
	}
	g.expires = t.UTC()
	return nil
}

type revocation struct {
	InstanceUUID        string `json:"instance_uuid"`
	WorkspaceUUID       string `json:"workspace_uuid"`
	EntitlementRevision *int64 `json:"entitlement_revision"`
}

func (r *revocation) validate() error {
	r.InstanceUUID, r.WorkspaceUUID = strings.TrimSpace(r.InstanceUUID), strings.TrimSpace(r.WorkspaceUUID)
	switch {
	case r.InstanceUUID == "" || r.WorkspaceUUID == "":
		return boxerr.Validation("instance_uuid", "instance_uuid and workspace_uuid must not be empty")
	case r.EntitlementRevision == nil || *r.EntitlementRevision < 1:
		return boxerr.Validation("entitlement_revision", "entitlement_revision must be an integer >= 1")
	}
	return nil
}

// admissionRecord is one Workspace's admission history.
type admissionRecord struct {
	current           *grant
	highestRevision   int64
	revokedRevision   int64
	highestGeneration int64
}

// grants holds the admission policy and every Workspace's record.
type grants struct {
	mu        sync.Mutex
	policy    admissionPolicy
	configErr string
	records   map[fenceKey]*admissionRecord
	now       func() time.Time
}

func newGrants() *grants {
	return &grants{policy: defaultAdmissionPolicy(), records: map[fenceKey]*admissionRecord{}, now: time.Now}
}

// configure reads the admission section of a config patch. An invalid one
// turns admission on with a configuration error (fail closed), and once on
// it cannot be turned off without a restart, as in the reference.
func (g *grants) configure(patch json.RawMessage) {
	var members map[string]json.RawMessage
	if json.Unmarshal(patch, &members) != nil {
		return
	}
	raw, ok := members["admission"]
	if !ok || string(raw) == "null" {
		return
	}
	p := defaultAdmissionPolicy()
	err := DecodeParams(raw, &p)
	if err == nil {
		err = p.check()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err != nil:
		g.policy.Required, g.configErr = true, err.Error()
	case g.policy.Required && !p.Required:
		g.configErr = "Sandbox admission enforcement cannot be disabled without restarting the Box Runtime"
	default:
		g.policy, g.configErr = p, ""
	}
}

func (g *grants) required() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.policy.Required
}

// enabledLocked refuses grant changes when admission is off or broken.
func (g *grants) enabledLocked() error {
	if !g.policy.Required {
		return boxerr.Admission("Sandbox admission enforcement is not enabled")
	}
	if g.configErr != "" {
		return boxerr.Readiness("Invalid sandbox admission configuration: %s", g.configErr)
	}
	return nil
}

// recordLocked returns k's record, creating it within capacity.
func (g *grants) recordLocked(k fenceKey, capacity int) (*admissionRecord, error) {
	g.purgeLocked()
	if r, ok := g.records[k]; ok {
		return r, nil
	}
	if len(g.records) >= capacity {
		return nil, boxerr.Admission("Sandbox admission record capacity reached; refusing an unbounded Workspace fence allocation")
	}
	r := &admissionRecord{}
	g.records[k] = r
	return r, nil
}

// purgeLocked drops expired grants (their revisions stay recorded).
func (g *grants) purgeLocked() {
	now := g.now()
	for _, r := range g.records {
		if r.current != nil && !r.current.expires.After(now) {
			r.current = nil
		}
	}
}

type grantInstalled struct {
	Installed           bool   `json:"installed"`
	WorkspaceUUID       string `json:"workspace_uuid"`
	ExecutionGeneration int64  `json:"execution_generation"`
	EntitlementRevision int64  `json:"entitlement_revision"`
	MaxSessions         int    `json:"max_sessions"`
	MaxManagedProcesses int    `json:"max_managed_processes"`
	ExpiresAt           string `json:"expires_at"`
}

// upsertGrant: box_upsert_sandbox_admission_grant. The checks run in the
// reference's order; installing a grant of a new generation (or the first,
// or one without sessions) destroys the Workspace's sessions, any other
// replacement all but the canonical one.
func (t *Tenancy) upsertGrant(ctx context.Context, in grant) (grantInstalled, error) {
	g := t.grants
	g.mu.Lock()
	cur, destroyAll, err := t.installLocked(&in)
	g.mu.Unlock()
	if err != nil {
		return grantInstalled{}, err
	}
	p := tenant.Placement{Instance: in.InstanceUUID, Workspace: in.WorkspaceUUID, Generation: *cur.ExecutionGeneration}
	t.destroyWorkspace(ctx, p, !destroyAll)
	out := grantInstalled{Installed: true, WorkspaceUUID: cur.WorkspaceUUID, ExecutionGeneration: *cur.ExecutionGeneration,
		EntitlementRevision: *cur.EntitlementRevision, MaxSessions: *cur.MaxSessions,
		MaxManagedProcesses: *cur.MaxManagedProcesses, ExpiresAt: cur.expires.Format("2006-01-02T15:04:05.999999") + "+00:00"}
	// The grant's generation passes the fence after it is installed: a
	// stale one is refused with the grant in place, as in the reference.
	if err := t.observe(ctx, p); err != nil {
		return grantInstalled{}, err
	}
	return out, nil
}

func (t *Tenancy) installLocked(in *grant) (cur *grant, destroyAll bool, err error) {
	g := t.grants
	if err := g.enabledLocked(); err != nil {
		return nil, false, err
	}
	if !t.trust.Matches(in.InstanceUUID) {
		return nil, false, boxerr.Permission("Sandbox admission grant does not match the trusted instance")
	}
	now := g.now()
	switch {
	case !in.expires.After(now):
		return nil, false, boxerr.Admission("Cannot install an expired sandbox admission grant")
	case in.expires.After(now.Add(time.Duration(g.policy.MaxGrantTTLSec) * time.Second)):
		return nil, false, boxerr.Admission("Sandbox admission grant lifetime exceeds the configured maximum")
	case *in.MaxSessions > g.policy.MaxSessions:
		return nil, false, boxerr.Admission("Sandbox admission grant exceeds the session cap")
	case *in.MaxManagedProcesses > g.policy.MaxManagedProcesses:
		return nil, false, boxerr.Admission("Sandbox admission grant exceeds the managed-process cap")
	}
	r, err := g.recordLocked(fenceKey{in.InstanceUUID, in.WorkspaceUUID}, t.rt.Config().Limits.MaxAdmissionRecords)
	if err != nil {
		return nil, false, err
	}
	rev, gen := *in.EntitlementRevision, *in.ExecutionGeneration
	switch {
	case rev <= r.revokedRevision:
		return nil, false, boxerr.Admission("Sandbox admission grant revision was revoked")
	case rev < r.highestRevision:
		return nil, false, boxerr.Admission("Sandbox admission grant revision is stale")
	case gen < r.highestGeneration:
		return nil, false, boxerr.Admission("Sandbox admission execution generation is stale")
	case rev == r.highestRevision && r.current != nil &&
		(*r.current.MaxSessions != *in.MaxSessions || *r.current.MaxManagedProcesses != *in.MaxManagedProcesses):
		return nil, false, boxerr.Admission("Sandbox admission limits changed without a new entitlement revision")
	}
	if c := r.current; c != nil && *c.EntitlementRevision == rev && *c.ExecutionGeneration == gen && !in.expires.After(c.expires) {
		return c, false, nil // a duplicate of a longer grant: nothing changes
	}
	destroyAll = r.current == nil || gen != r.highestGeneration || *in.MaxSessions == 0
	r.current, r.highestRevision, r.highestGeneration = in, rev, gen
	return in, destroyAll, nil
}

type grantRevoked struct {
	Revoked             bool   `json:"revoked"`
	WorkspaceUUID       string `json:"workspace_uuid"`
	EntitlementRevision int64  `json:"entitlement_revision"`
}

// revokeGrant: box_revoke_sandbox_admission_grant removes the grant,
// keeps its revision as a tombstone and destroys the Workspace's sessions.
func (t *Tenancy) revokeGrant(ctx context.Context, in revocation) (grantRevoked, error) {
	g := t.grants
	g.mu.Lock()
	err := g.enabledLocked()
	if err == nil && !t.trust.Matches(in.InstanceUUID) {
		err = boxerr.Permission("Sandbox admission revocation does not match the trusted instance")
	}
	var r *admissionRecord
	if err == nil {
		r, err = g.recordLocked(fenceKey{in.InstanceUUID, in.WorkspaceUUID}, t.rt.Config().Limits.MaxAdmissionRecords)
	}
	rev := *in.EntitlementRevision
	if err == nil && rev < max(r.highestRevision, r.revokedRevision) {
		err = boxerr.Admission("Sandbox admission revocation is stale")
	}
	if err == nil {
		r.current, r.highestRevision, r.revokedRevision = nil, rev, rev
	}
	g.mu.Unlock()
	if err != nil {
		return grantRevoked{}, err
	}
	t.destroyWorkspace(ctx, tenant.Placement{Instance: in.InstanceUUID, Workspace: in.WorkspaceUUID}, false)
	return grantRevoked{Revoked: true, WorkspaceUUID: in.WorkspaceUUID, EntitlementRevision: rev}, nil
}

// destroyWorkspace deletes the Workspace's sessions of every generation;
// keepCanonical spares the canonical session of p's generation.
func (t *Tenancy) destroyWorkspace(ctx context.Context, p tenant.Placement, keepCanonical bool) {
	canonical, _ := p.PhysicalID(t.grants.policy.LogicalSessionID)
	all := t.rt.Internal()
	for _, s := range all.Sessions() {
		if p.InWorkspace(s.SessionID) && !(keepCanonical && s.SessionID == canonical) {
			_ = all.DeleteSession(context.WithoutCancel(ctx), s.SessionID)
		}
	}
}

// admit runs the per-request admission check of a sandbox action in
// admission mode on its decoded params (req), and holds them to the
// policy: the spec actions always use the canonical session, the others
// that name a session must name it, and none may make another (a fork) or
// replace the policy's spec (from_snapshot).
func (t *Tenancy) admit(ctx context.Context, p tenant.Placement, method string, req decoded) error {
	g := t.grants
	if !sandboxAction(method) || !g.required() {
		return nil
	}
	g.mu.Lock()
	configErr := g.configErr
	g.mu.Unlock()
	if configErr != "" {
		return boxerr.Readiness("Invalid sandbox admission configuration: %s", configErr)
	}
	// Readiness first, then the grant, as in the reference.
	if err := t.ready(ctx); err != nil {
		return err
	}
	g.mu.Lock()
	policy := g.policy
	g.purgeLocked()
	var cur *grant
	if r := g.records[fenceKey{p.Instance, p.Workspace}]; r != nil {
		cur = r.current
	}
	g.mu.Unlock()
	switch {
	case cur == nil:
		return boxerr.Admission("Sandbox admission grant is missing")
	case *cur.ExecutionGeneration != p.Generation:
		return boxerr.Admission("Sandbox admission grant belongs to another execution generation")
	case *cur.MaxSessions <= 0:
		return boxerr.Admission("Sandbox admission grant does not permit sessions")
	case *cur.MaxSessions > policy.MaxSessions || *cur.MaxManagedProcesses > policy.MaxManagedProcesses:
		return boxerr.Admission("Sandbox admission grant exceeds the active runtime policy")
	case method == "box_start_managed_process" && *cur.MaxManagedProcesses <= 0:
		return boxerr.Admission("Sandbox admission grant does not permit managed processes")
	}
	if !req.read {
		return nil // the method's decoder words the error
	}
	if err := runtimeOwned(req, policy); err != nil {
		return err
	}
	sr, ok := req.params.(specRequest)
	if !ok {
		return nil
	}
	s := sr.specOf()
	workspace := filepath.Join(skills.ResolveRoot(".", t.rt.Config().DefaultWorkspace()), "tenants", p.Namespace())
	if err := managedSpec(s, policy, workspace); err != nil {
		return err
	}
	if err := workspaceSkill(ctx, skills.FromContext(ctx, t.next.skills), s.spec.SkillName); err != nil {
		return err
	}
	physical, _ := p.PhysicalID(policy.LogicalSessionID)
	if err := t.sessionRoom(p, physical, *cur.MaxSessions); err != nil {
		return err
	}
	s.spec.SessionID = policy.LogicalSessionID
	return nil
}

// runtimeOwned refuses a request that would make another session (a fork),
// restore one from a snapshot, or name a session other than the policy's
// canonical one (the spec actions' session id is replaced instead). A
// member the decoding refused (unknown to the method, or of the wrong
// type) counts as sent.
func runtimeOwned(req decoded, policy admissionPolicy) error {
	sr, spec := req.params.(specRequest)
	if v, has := stringMember(req.params, "new_session_id"); has && v != "" || refusedMember(req.err, "new_session_id") {
		return boxerr.Admission("Managed sandbox sessions are runtime-owned; a grant permits no other session")
	}
	if spec && sr.specOf().spec.FromSnapshot != "" || refusedMember(req.err, "from_snapshot") {
		return boxerr.Admission("Managed sandbox cannot be restored from a snapshot; its spec is runtime-owned")
	}
	if spec {
		return nil
	}
	id, has := stringMember(req.params, "session_id")
	if has && id != "" && strings.TrimSpace(id) != policy.LogicalSessionID || refusedMember(req.err, "session_id") {
		return boxerr.Admission("Managed sandbox session_id is runtime-owned")
	}
	return nil // none named: an exec, snapshot or watch of the Workspace's own
}

// stringMember returns the string member of params (a pointer to a
// method's params struct) whose JSON name is name, at its top level or
// promoted from an embedded struct; has is false when it has none.
func stringMember(params any, name string) (v string, has bool) {
	pv := reflect.ValueOf(params)
	if pv.Kind() != reflect.Pointer || pv.Elem().Kind() != reflect.Struct {
		return "", false
	}
	for _, f := range reflect.VisibleFields(pv.Elem().Type()) {
		if f.IsExported() && !f.Anonymous && f.Type.Kind() == reflect.String && jsonName(f) == name {
			return pv.Elem().FieldByIndex(f.Index).String(), true
		}
	}
	return "", false
}

// sessionRoom enforces the grant's session limit for the Workspace.
func (t *Tenancy) sessionRoom(p tenant.Placement, target string, limit int) error {
	n, exists := 0, false
	for _, s := range t.rt.Internal().Sessions() {
		if p.InWorkspace(s.SessionID) {
			n++
			exists = exists || s.SessionID == target
		}
	}
	switch {
	case n > limit:
		return boxerr.Admission("Sandbox admission session limit exceeded")
	case !exists && n >= limit:
		return boxerr.Admission("Sandbox admission session limit reached")
	}
	return nil
}

// workspaceSkill refuses a skill_name the Workspace's own skill store does
// not hold, in the reference's words, before any session is touched; the
// runtime then mounts it from that same store (the one in ctx).
func workspaceSkill(ctx context.Context, store *skills.Store, name string) error {
	if strings.TrimSpace(name) == "" {
		return nil
	}
	if _, err := store.PackageRoot(ctx, name); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return boxerr.Admission("Managed sandbox skill is unavailable in this Workspace").Wrap(err)
	}
	return nil
}

// managedSpec refuses what a grant-enforced sandbox may not ask for, as
// the reference does, and forces the policy's resources onto the spec:
// network off, no extra mounts, the runtime-owned /workspace (a host_path,
// if sent, must be the Workspace's own directory, which the host sends), a
// persistent session, the policy's timeout cap and limits, the default
// image. It reads the values as decoded, before the spec's normalisation.
func managedSpec(s *sessionSpec, policy admissionPolicy, workspace string) error {
	spec := &s.spec
	workdir, hostPath := strings.TrimSpace(spec.Workdir), strings.TrimSpace(spec.HostPath)
	switch {
	case strings.TrimSpace(string(spec.Network)) != string(backends.NetworkOff):
		return boxerr.Admission("Managed sandbox network access is disabled")
	case len(spec.ExtraMounts) > 0:
		return boxerr.Admission("Managed sandbox additional host mounts are disabled")
	case strings.TrimSpace(spec.MountPath) != backends.DefaultMountPath:
		return boxerr.Admission("Managed sandbox mount_path is runtime-owned")
	case workdir != "" && workdir != "/workspace" && !strings.HasPrefix(workdir, "/workspace/"):
		return boxerr.Admission("Managed sandbox workdir must stay under /workspace")
	case hostPath != "" && filepath.Clean(hostPath) != workspace:
		return boxerr.Admission("Managed sandbox host_path is runtime-owned")
	}
	// A timeout left out, or out of the policy's range, is the policy's
	// maximum; the method's own default does not apply.
	if !s.timeoutSent || spec.TimeoutSec <= 0 || spec.TimeoutSec > policy.MaxTimeoutSec {
		spec.TimeoutSec = policy.MaxTimeoutSec
	}
	spec.Image = ""
	spec.Network, spec.Persistent = backends.NetworkOff, true
	spec.CPUs, spec.MemoryMB, spec.PidsLimit = policy.CPUs, policy.MemoryMB, policy.PidsLimit
	spec.ReadOnlyRootfs, spec.WorkspaceQuotaMB = policy.ReadOnlyRootfs, policy.WorkspaceQuotaMB
	return nil
}
