// Package host is the unsandboxed backend LangBot calls "host": commands
// and managed processes run directly on the machine boxrt runs on, as the
// user boxrt runs as, with no isolation at all. It exists for operators
// who already isolate boxrt itself (a dedicated VM or container) and want
// the host's tools.
//
// It is never chosen automatically: only a configuration naming "host"
// selects it, and the LangBot layer refuses that over a WebSocket that has
// no control token. A session is a directory (its workspace, or the
// session's host_path); the sandbox paths a spec names (/workspace and the
// extra mounts' mount paths) are rewritten to their host directories in
// workdir and cwd. Each command and process runs in a process group of its
// own, killed as a group on timeout, cancellation and stop, with a minimal
// environment (PATH, LANG, LC_ALL, LC_CTYPE, TERM from boxrt's own, HOME
// and TMPDIR in the session, LANGBOT_BOX_WORKSPACE, and the spec's env):
// nothing of boxrt's environment — the control token above all — leaks.
package host
