// Package backends owns the models every sandbox backend shares — the
// session Spec, MountSpec, SessionInfo, ExecRequest/ExecResult, ProcessSpec —
// their validation (numeric bounds, sandbox-side mount points) and the
// host-path allow-list checks both backends apply, the Backend interface
// the runtime drives, and the typed error kinds that
// travel from a backend up to the wire. It is the leaf of the dependency
// graph: runtime, actions and every backend subpackage import it, it imports
// none of them.
package backends
