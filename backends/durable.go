package backends

import (
	"context"
	"io"
)

// Session states (Session.State; "" reads as running). StateLost is the
// runtime's: the sandbox was found gone (removed behind boxrt's back); the
// next use creates the session again.
const (
	StateRunning   = "running"
	StateSuspended = "suspended"
	StateLost      = "lost"
)

// Census is implemented by backends that can tell cheaply, for all
// sessions at once, which sandboxes of this installation still exist, so
// that listing sessions never reports a gone one as running. The runtime
// checks for it with a type assertion; without it, it asks Alive per
// session.
type Census interface {
	// Existing returns the BackendSessionIDs of this installation's
	// sandboxes that exist now, running or suspended.
	Existing(ctx context.Context) (map[string]bool, error)
}

// SandboxKiller is implemented by backends that can end what many
// sessions' sandboxes run at once, without waiting for it. When many
// sessions go together (boxrt's exit, box_shutdown, a pool's drain) the
// runtime calls it first and then StopSession for each as usual, a few at
// a time: the sandboxes are torn down together instead of one after
// another, and each StopSession finds little left to wait for. The runtime
// checks for it with a type assertion.
type SandboxKiller interface {
	KillSandboxes(ctx context.Context, infos []Session)
}

// Suspender is implemented by backends that can keep a session without
// running anything for it. The runtime checks for it with a type assertion.
type Suspender interface {
	// Suspend ends everything the session runs (managed processes are the
	// runtime's to stop first) and keeps its files and spec. The mark is
	// durable: after a restart, Adopt reports the session with State
	// StateSuspended instead of restarting or removing it.
	Suspend(ctx context.Context, info Session) error
	// Resume makes a suspended session runnable again and clears the mark.
	Resume(ctx context.Context, info Session) error
}

// Restarter is implemented by backends whose sandboxes can stop without
// being removed: a Docker engine that restarts (without live-restore) stops
// every container, keeping its files. The runtime then starts the sandbox
// again rather than replacing it with an empty one.
type Restarter interface {
	// Restart starts a stopped sandbox again: its files are kept, its
	// processes are gone. A sandbox that no longer exists is
	// ErrSessionNotFound.
	Restart(ctx context.Context, info Session) error
}

// SuspendChecker is implemented by Suspenders that can suspend only some
// sessions (kube: only those whose workspace outlives the Pod). The
// reaper asks before choosing suspension as an idle session's fate.
type SuspendChecker interface {
	CanSuspend(info Session) bool
}

// Archive entry prefixes: a session's files travel as one tar stream whose
// top-level directories say where each part belongs.
const (
	// ArchiveWorkspace holds the workspace (mount_path), relative to it.
	ArchiveWorkspace = "workspace/"
	// ArchiveRootfs holds what changed in the container's own filesystem
	// (installed packages…), relative to /.
	ArchiveRootfs = "rootfs/"
	// ArchiveTmp holds /tmp (bwrap; docker with a read-only root
	// filesystem), ArchiveHome a bwrap session's /home.
	ArchiveTmp  = "tmp/"
	ArchiveHome = "home/"
)

// ExportOptions says what an export may include.
type ExportOptions struct {
	// HostPaths includes a host_path workspace's files. Extra mounts and
	// skills are never included: they are the host's, not the session's.
	HostPaths bool
}

// Archiver is implemented by backends that can write a session's files as a
// tar stream (entries under the Archive* prefixes) and load such a stream
// into a freshly started session. The session may be running or suspended.
type Archiver interface {
	ExportFiles(ctx context.Context, info Session, opts ExportOptions, w io.Writer) error
	ImportFiles(ctx context.Context, info Session, r io.Reader) error
}

// PoolSessionPrefix starts the placeholder session id of every pooled
// sandbox; hosts cannot use such ids.
const PoolSessionPrefix = "__pool__"

// Pooler is implemented by backends whose sandboxes can be started ahead
// of need (for a placeholder session id) and handed to a session later.
type Pooler interface {
	// Claim hands the pooled sandbox info over to spec's session: the
	// same sandbox (spec may differ in Persistent only), recorded
	// durably, so that after a restart Adopt reports it under spec's
	// session id. It returns the session as the new owner sees it.
	Claim(ctx context.Context, info Session, spec SandboxSpec) (Session, error)
}

// ExecPrestarter is implemented by backends that can start a sandbox's
// next exec before its command is known (a shell waiting for its command
// line: in a docker exec, in a bwrap sandbox spawned with the session's
// mounts and limits), so that the command skips what starting one costs. The
// runtime asks for it on pooled sandboxes, whose first command's latency
// is what a pool is for (docker also starts one after every plain exec,
// for the session's next). A prestarted exec serves one plain exec
// (ExecRequest.Plain); anything else runs as usual.
type ExecPrestarter interface {
	PrestartExec(ctx context.Context, info Session) error
}

// ClaimChecker is implemented by Poolers whose pooled sandboxes can serve
// only some sessions (kube: not persistent ones, whose workspace is a
// PersistentVolumeClaim a pooled Pod lacks). The runtime asks before it
// takes a pooled sandbox, so that one is not spent on a failing Claim.
type ClaimChecker interface {
	CanClaim(spec SandboxSpec) bool
}
