package backends

import "context"

// Backend runs sessions. Implementations must be safe for concurrent use;
// the runtime serialises calls per session but not across sessions.
type Backend interface {
	// Name is the wire name: "docker", "bwrap".
	Name() string
	// Probe checks that the backend can start sandboxes right now. It may
	// do I/O; the runtime caches its outcome.
	Probe(ctx context.Context) error
	// Describe reports static facts (which limits are enforced, …) without
	// I/O.
	Describe() Description
	// DefaultImage is the image a spec without one gets.
	DefaultImage() string
	StartSession(ctx context.Context, spec SandboxSpec) (Session, error)
	// Alive reports whether the session's sandbox still exists and runs.
	Alive(ctx context.Context, info Session) bool
	Exec(ctx context.Context, info Session, req ExecRequest) (ExitStatus, error)
	StartProcess(ctx context.Context, info Session, spec ProcessSpec) (Process, error)
	StopSession(ctx context.Context, info Session) error
	// Adopt returns the sessions this installation left running (same
	// instance id), so a restarted boxrt can serve them again. Sandboxes of
	// other installations are never returned or touched. An error may come
	// with sessions: those are adopted, the error says what was not.
	Adopt(ctx context.Context) ([]Session, error)
}

// Description is what box_get_backend_info reports about a backend beyond
// its name and availability.
type Description struct {
	// EnforcedLimits lists which of "memory", "pids", "cpus" the backend
	// really enforces on this machine.
	EnforcedLimits []string `json:"enforced_limits"`
	// Isolation is a one-line summary, e.g. "container (runc)".
	Isolation string `json:"isolation"`
	// IsolationLevels are the levels beyond the default a spec's isolation
	// may ask for here (e.g. "gvisor"); empty when the operator allowed none.
	IsolationLevels []string `json:"isolation_levels"`
	// SkillsLive is true when skills can be added to a running session
	// without recreating it.
	SkillsLive bool `json:"skills_live"`
	// Notes are human-readable caveats.
	Notes []string `json:"notes,omitempty"`
}
