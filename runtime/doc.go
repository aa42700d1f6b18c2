// Package runtime owns boxrt's state: the configuration and its atomic
// updates, backend selection with a cached health probe, the session table
// (get-or-create, compatibility, liveness, capacity), exec with bounded
// head/tail output capture, live execs (execs.go: streamed output through a
// bounded replay log, background execs with stdin, terminals, kill and
// re-attach by exec id), managed processes, the TTL reaper, session
// events (events.go, webhook.go), exposed ports (ports.go) and usage
// (usage.go). Each part
// owns its state and its lock (settings.go, backend.go, session_table.go,
// Execs, Processes, Files, Snapshots, pool.go, counters.go, Events,
// Ports); Runtime
// composes them and coordinates what spans them: a session's creation,
// suspension, resumption and destruction, reaping and shutdown. It owns
// the wire-facing session model too (model.go): Spec with its defaults and
// validation, SessionInfo as the host sees it, ExecResult, and
// compatibilityFields, the one list of the fields a reused session must
// match; it hands backends the backends.SandboxSpec inside a Spec. It
// drives sandboxes only through backends.Backend, so its logic is unit
// tested with a fake backend and a fake clock.
package runtime
