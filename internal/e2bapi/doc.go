// Package e2bapi serves E2B's API on boxrt's HTTP listener, so the
// unchanged E2B SDKs drive boxrt sessions: the control API under /e2b
// (sandboxes: create, list, get, kill, timeout, pause, resume, connect),
// authenticated by the control token sent as X-API-Key; and envd under
// /e2b/envd (Connect RPC process.Process and filesystem.Filesystem, plain
// HTTP /files and /health), routed by the E2b-Sandbox-Id header and
// authenticated by the sandbox's own access token (X-Access-Token).
//
// It owns the E2B view of a session: the access token, template,
// metadata, end time and the pid of each command. The session itself, its
// execs and files are the runtime's; every call runs in the placement the
// request's scope names, so ids resolve within it as on JSON-RPC.
package e2bapi
