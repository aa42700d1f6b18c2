package actions

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/skills"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// Action scopes: host-control actions need no tenant context (one, if
// sent, must name the trusted instance); every other action is a tenant
// action, run in its placement's namespace and fenced. Tenant actions that
// touch no sandbox are listed; every other one (a new method included) is
// a sandbox action, which admission mode grants or refuses.
var (
	hostControlActions = map[string]bool{
		"__ping": true, "__file_chunk": true, "box_health": true, "box_get_backend_info": true,
		"box_init": true, "box_upsert_sandbox_admission_grant": true, "box_revoke_sandbox_admission_grant": true,
		"box_verify_shared_workspace": true, "box_shutdown": true,
	}
	sandboxFreeActions = map[string]bool{
		"box_status": true, "box_get_storage_analysis": true,
		"box_list_skills": true, "box_get_skill": true, "box_create_skill": true, "box_update_skill": true,
		"box_delete_skill": true, "box_scan_skill_directory": true, "box_list_skill_files": true,
		"box_read_skill_file": true, "box_write_skill_file": true, "box_preview_skill_zip": true,
		"box_install_skill_zip": true,
	}
)

// sandboxAction reports whether method touches a sandbox (a session, its
// execs, processes, files or snapshots).
func sandboxAction(method string) bool {
	return !hostControlActions[method] && !sandboxFreeActions[method]
}

// InstanceIDPattern is what an instance id (header or trusted setting)
// must look like.
var InstanceIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// Trust is the LangBot instance this runtime serves: configured
// (LANGBOT_BOX_TRUSTED_INSTANCE_UUID), or pinned by the first
// authenticated control connection.
type Trust struct {
	mu       sync.Mutex
	instance string
	// pinOnContext: the first tenant context pins the instance (JSON-RPC
	// mode, where no control connection names one).
	pinOnContext bool
}

// NewTrust returns the trust of a runtime; instance may be "" (not yet
// pinned).
func NewTrust(instance string, pinOnContext bool) *Trust {
	return &Trust{instance: strings.TrimSpace(instance), pinOnContext: pinOnContext}
}

// Pin admits a control connection of instance: the first one pins it when
// none is configured, later ones must name the same.
func (t *Trust) Pin(instance string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.instance == "" {
		t.instance = instance
	}
	return t.instance == instance
}

// Matches reports whether a context's or relay request's instance is the
// trusted one; it never pins, except a first context in JSON-RPC mode.
func (t *Trust) Matches(instance string) bool {
	instance = strings.TrimSpace(instance)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.instance == "" && t.pinOnContext && instance != "" {
		t.instance = instance
	}
	return t.instance != "" && t.instance == instance
}

// pinned reports whether instance is the trusted one, never pinning: an
// HTTP request's headers, read before its credentials are, must not.
func (t *Trust) pinned(instance string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.instance != "" && t.instance == instance
}

// Tenancy wraps the Dispatcher with LangBot's tenancy: action scopes,
// trusted contexts, per-Workspace session namespaces, the generation
// fence and admission grants. The runtime below it stays tenant-agnostic:
// it resolves every id within the placement the context carries
// (runtime/tenant), which this layer puts there once per request.
type Tenancy struct {
	next   *Dispatcher
	rt     *runtime.Runtime
	trust  *Trust
	fence  *Fence
	grants *grants
	// readiness caches grant-enforced mode's readiness object.
	readiness readinessCache
	// running are the tenant actions in flight, per Workspace generation.
	running inflight
	// required: tenant actions without a context are refused (LangBot
	// mode). Otherwise they run unnamespaced, as single-tenant JSON-RPC.
	required bool
	// langbot: answer in the reference's shapes where boxrt's differ.
	langbot bool
	// openWS: see TenancyOptions.OpenWebSocket.
	openWS bool
	log    zerolog.Logger
	own    map[string]handler

	mu sync.Mutex
	// requestedBackend is the LangBot backend name behind the configured
	// one ("nsjail" for bwrap), for box_get_backend_info.
	requestedBackend string
}

// TenancyOptions configure NewTenancy.
type TenancyOptions struct {
	// Required: tenant actions need a trusted context (LangBot mode).
	Required bool
	// LangBot: answer box_init with {"initialized": true} only, as the
	// reference does.
	LangBot bool
	// OpenWebSocket: /rpc/ws takes no token (LangBot mode without
	// LANGBOT_BOX_CONTROL_TOKEN), so it may not select the unsandboxed host
	// backend.
	OpenWebSocket bool
	// Log receives what the layer adapted in the host's configuration.
	Log zerolog.Logger
}

// NewTenancy returns the tenancy layer around d.
func NewTenancy(d *Dispatcher, trust *Trust, opts TenancyOptions) *Tenancy {
	t := &Tenancy{next: d, rt: d.rt, trust: trust, required: opts.Required, langbot: opts.LangBot, openWS: opts.OpenWebSocket, log: opts.Log}
	t.fence = NewFence(func() int { return t.rt.Config().Limits.MaxAdmissionRecords })
	t.grants = newGrants()
	t.own = map[string]handler{
		"box_upsert_sandbox_admission_grant": method(t.upsertGrant),
		"box_revoke_sandbox_admission_grant": method(t.revokeGrant),
		"box_verify_shared_workspace":        method(t.verifySharedWorkspace),
		"box_get_storage_analysis":           method(t.storageAnalysis),
	}
	return t
}

// Fence is the generation fence the relay checks.
func (t *Tenancy) Fence() *Fence { return t.fence }

// Trust is the trusted instance.
func (t *Tenancy) Trust() *Trust { return t.trust }

// Methods lists every method served, the dispatcher's and the tenancy's.
func (t *Tenancy) Methods() []string {
	out := t.next.Methods()
	for name := range t.own {
		out = append(out, name)
	}
	return out
}

func errNoContext() error {
	return boxerr.Permission("Box tenant action requires a trusted Workspace context")
}

func errOtherInstance() error {
	return boxerr.Permission("Box action context does not match the trusted instance")
}

// Handle implements rpc.Handler. Failures are kept in the dispatcher's
// ring of recent errors, as the dispatcher's own are.
func (t *Tenancy) Handle(ctx context.Context, req *rpc.Request) (json.RawMessage, error) {
	res, err := t.handle(ctx, req)
	if errors.Is(err, rpc.ErrNoReply) {
		return nil, err // cancelled by a newer generation: not a failure
	}
	return res, t.next.record(req, err)
}

func (t *Tenancy) handle(ctx context.Context, req *rpc.Request) (json.RawMessage, error) {
	meta := req.Meta
	_, own := t.own[req.Method]
	if _, served := t.next.methods[req.Method]; !served && !own {
		// Unknown whatever the context: "Action <name> not found".
		return t.next.call(ctx, req)
	}
	if hostControlActions[req.Method] {
		if meta != nil && !t.trust.Matches(meta.InstanceUUID) {
			return nil, errOtherInstance()
		}
		return t.hostControl(ctx, req)
	}
	if meta == nil {
		if t.required {
			return nil, errNoContext()
		}
		if h, ok := t.own[req.Method]; ok {
			return h(ctx, req.Params)
		}
		return t.next.call(ctx, req)
	}
	if strings.TrimSpace(meta.InstanceUUID) == "" || strings.TrimSpace(meta.WorkspaceUUID) == "" {
		return nil, errNoContext()
	}
	if !t.trust.Matches(meta.InstanceUUID) {
		return nil, errOtherInstance()
	}
	p := PlacementOf(meta)
	ctx = tenant.WithPlacement(ctx, p)
	ctx, done := t.running.start(ctx, p)
	defer done()
	res, err := t.tenant(ctx, req, p)
	if retired(ctx) {
		// A newer generation cancelled it: the reference never answers
		// such an action; JSON-RPC clients get the fence's refusal.
		if t.langbot {
			return nil, rpc.ErrNoReply
		}
		return nil, errStale()
	}
	if err == nil && !t.fence.Holds(p) {
		// The generation advanced while the action ran: its side effects
		// stay, its answer is refused, as in the reference.
		err = errStale()
	}
	return res, err
}

// tenant runs a fenced action for placement p, which ctx carries.
func (t *Tenancy) tenant(ctx context.Context, req *rpc.Request, p tenant.Placement) (json.RawMessage, error) {
	if t.langbot {
		if err := missingKey(req.Method, req.Params); err != nil {
			return nil, err
		}
	}
	// Every skill operation and skill mount of a Workspace stays in its
	// own store, <skills_root>/tenants/<namespace>.
	store, err := t.next.skills.Scoped(p.Namespace())
	if err != nil {
		return nil, err
	}
	ctx = skills.NewContext(ctx, store)
	// The method decodes the params once; admission, the image fitting and
	// the fence run on what it decoded, before its own errors.
	ctx = withGate(ctx, func(ctx context.Context, d decoded) error {
		// The admission check runs before the fence, as in the reference.
		if err := t.admit(ctx, p, req.Method, d); err != nil {
			return err
		}
		if sr, ok := d.params.(specRequest); ok && t.langbot {
			t.fitImage(sr.specOf())
		}
		return t.observe(ctx, p)
	})
	if h, ok := t.own[req.Method]; ok {
		return h(ctx, req.Params)
	}
	inner := *req
	inner.Meta = nil
	res, err := t.next.call(ctx, &inner)
	if err != nil {
		return nil, err
	}
	switch req.Method {
	case "box_status":
		return t.placementStatus(ctx, res)
	case "box_delete_session":
		// The reference answers the id exactly as sent; the method trims it.
		var ref sessionRef
		_ = json.Unmarshal(req.Params, &ref)
		return encodeResult(deleted{Deleted: ref.SessionID})
	}
	return res, nil
}

// observe passes p through the fence and retires the sessions of the
// Workspace's other generations when p's is new.
func (t *Tenancy) observe(ctx context.Context, p tenant.Placement) error {
	advanced, err := t.fence.Observe(p)
	if err != nil {
		return err
	}
	if advanced {
		t.running.retire(p)
		t.retire(ctx, p)
	}
	return nil
}

// retire deletes every session of p's Workspace that is not of p's
// generation, through the runtime's view across namespaces (p's own sees
// only its generation); deleting a session stops its managed processes,
// which ends their relays.
func (t *Tenancy) retire(ctx context.Context, p tenant.Placement) {
	all := t.rt.Internal()
	for _, s := range all.Sessions() {
		if p.InWorkspace(s.SessionID) && !p.Owns(s.SessionID) {
			// Already gone is as good as retired.
			_ = all.DeleteSession(context.WithoutCancel(ctx), s.SessionID)
		}
	}
}

// placementStatus counts the sessions of ctx's placement only and leaves
// out the runtime's recent errors, which name other tenants' sessions.
func (t *Tenancy) placementStatus(ctx context.Context, res json.RawMessage) (json.RawMessage, error) {
	var st map[string]any
	if err := json.Unmarshal(res, &st); err != nil {
		return nil, boxerr.Failure("cannot read the status: %v", err).Wrap(err)
	}
	st["active_sessions"] = len(t.rt.ListSessions(ctx))
	st["recent_errors"] = []any{}
	return encodeResult(st)
}

// hostControl runs a host-control action, adapting box_init and
// box_get_backend_info to the host's backend names.
func (t *Tenancy) hostControl(ctx context.Context, req *rpc.Request) (json.RawMessage, error) {
	if h, ok := t.own[req.Method]; ok {
		return h(ctx, req.Params)
	}
	switch req.Method {
	case "box_init":
		params, requested, err := TranslateLangBotConfig(req.Params)
		if err != nil {
			return nil, err
		}
		if t.openWS && rpc.TransportFrom(ctx) == rpc.TransportWebSocket && namesBackend(params, HostBackend) {
			return nil, ErrOpenHostBackend()
		}
		if t.langbot {
			var notes []string
			params, notes = FitLangBotMountRoots(t.rt.Config(), params)
			for _, n := range notes {
				t.log.Warn().Msg(n)
			}
		}
		t.grants.configure(req.Params)
		t.readiness.clear()
		inner := *req
		inner.Params = params
		res, err := t.next.call(ctx, &inner)
		if err != nil {
			return nil, err
		}
		if requested != "" || backendNamed(req.Params) {
			t.mu.Lock()
			t.requestedBackend = requested
			t.mu.Unlock()
		}
		if t.langbot {
			return json.RawMessage(`{"initialized":true}`), nil
		}
		return res, nil
	case "box_health":
		if t.grants.required() {
			return t.admissionHealth(ctx)
		}
	case "box_get_backend_info":
		if t.grants.required() {
			return t.admissionBackendInfo(ctx)
		}
		res, err := t.next.call(ctx, req)
		if err != nil {
			return nil, err
		}
		return t.annotateBackend(res)
	}
	return t.next.call(ctx, req)
}

// annotateBackend says which LangBot backend name the running backend
// stands for, when the host asked for one boxrt maps (nsjail → bwrap).
func (t *Tenancy) annotateBackend(res json.RawMessage) (json.RawMessage, error) {
	requested := t.requested()
	if requested == "" && !bytes.Contains(res, []byte(`"name":"`+HostBackend+`"`)) {
		return res, nil // nothing to add: the heartbeat-cheap path
	}
	var info map[string]any
	if err := json.Unmarshal(res, &info); err != nil {
		return nil, boxerr.Failure("cannot read the backend info: %v", err).Wrap(err)
	}
	if info["name"] == HostBackend {
		info["unsafe_direct_execution"] = true
	}
	if requested == "" {
		return encodeResult(info)
	}
	info["requested_backend"] = requested
	if note, ok := backendAliasNotes[requested]; ok {
		info["requested_backend_note"] = note
	}
	return encodeResult(info)
}

func (t *Tenancy) requested() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.requestedBackend
}

// backendNamed reports whether a config patch names a backend, which
// replaces any earlier requested one.
func backendNamed(patch json.RawMessage) bool {
	var members map[string]json.RawMessage
	_ = json.Unmarshal(patch, &members)
	_, ok := members["backend"]
	return ok
}

// HostBackend is the unsandboxed backend's name.
const HostBackend = "host"

// ErrOpenHostBackend refuses the host backend on a WebSocket anyone on the
// machine may open, as the reference does.
func ErrOpenHostBackend() error {
	return boxerr.Validation("backend", "host backend requires local stdio control or WebSocket control protected by LANGBOT_BOX_CONTROL_TOKEN")
}

// namesBackend reports whether a config patch selects backend name.
func namesBackend(patch json.RawMessage, name string) bool {
	var members struct {
		Backend string `json:"backend"`
	}
	_ = json.Unmarshal(patch, &members)
	return members.Backend == name
}

// fitImage leaves out a spec's Docker image reference when the backend is
// bwrap, whose images are rootfs directories: the host always names its
// Docker image, and the reference's nsjail backend (which bwrap stands
// for) ignores it the same way, running on the host's system directories.
func (t *Tenancy) fitImage(s *sessionSpec) {
	if name := t.rt.BackendInfo().Name; name == nil || *name != "bwrap" {
		return
	}
	if image := strings.TrimSpace(s.spec.Image); image != "" && image != "host" && !strings.HasPrefix(image, "/") {
		s.spec.Image = ""
	}
}
