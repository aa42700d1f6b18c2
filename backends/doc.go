// Package backends owns what every sandbox backend shares: the Backend
// interface the runtime drives, and the backend-facing model it takes and
// returns — Sandbox (what a sandbox is made of, the JSON form backends
// persist), SandboxSpec (StartSession's input, already validated by the
// runtime), Session (a started sandbox), MountSpec, ExecRequest/ExitStatus,
// ProcessSpec/Process — with the sandbox fields' defaults and bounds, the
// sandbox-side mount point rule (CheckMountPath) and the host-path
// allow-list checks both backends apply. The wire-facing session model
// (Spec, SessionInfo, ExecResult) is runtime's. It is a leaf of the
// dependency graph: runtime and every backend subpackage import it, it
// imports only internal/boxerr.
//
// ExecRequest's live fields (Stdin, TTY, Resize, Signals) are part of the
// Exec contract, not an option: the runtime sets them for streamed and
// background execs and waits on them (a stdin write until the backend
// reads it, a resize until Done, a signal until it is taken), so every
// backend must serve them while the command runs.
package backends
