// Package reconnect is the Go client a host embeds to drive boxrt: it
// spawns `boxrt serve --stdio` (Spawn), dials a runtime's /rpc/ws (Dial),
// or accepts runtimes that dial the host (`boxrt serve --connect`,
// Listener), speaks JSON-RPC 2.0 to it, and keeps the link alive.
//
// What it does for the host:
//
//   - Heartbeat: __ping every 20 s with a 15 s timeout; 3 unanswered pings
//     in a row declare the link dead (WithHeartbeat). A child that exits or
//     a socket that closes is noticed at once, without waiting for pings.
//   - Reconnect: a dead link is replaced — in spawn mode the child is
//     stopped, reaped and respawned — with exponential backoff between
//     failed attempts: 3 s doubling to 60 s, each wait jittered by ±20 %
//     (WithBackoff, WithJitter; the exact rule is on Client).
//   - Handshake: every new link gets __ping and then the OnConnect hook
//     (typically box_init with the host's config) before calls that queued
//     during the outage are released, so the runtime never sees a tenant
//     call before its configuration (LangBot's issue #4).
//   - Failure semantics: calls in flight when the link dies fail at once
//     with a retryable BoxRuntimeUnavailableError; calls made while it is
//     down wait until it is back or their context ends. Nothing is retried
//     behind the caller's back, because box_exec is not idempotent.
//   - State: a spawned runtime gets a private state directory of the
//     Client's, removed at Close, and its sessions end with each child
//     (WithStateDir names a lasting one): it never adopts or destroys the
//     sessions of a boxrt serving on this machine's default directory.
//   - Errors: boxrt's wire errors come back as *Error, matched with
//     errors.Is against ErrSessionNotFound, ErrValidation, … and unpacked
//     with errors.As. A child that cannot start (exit status 1 or 2 before
//     its first answer: an unknown flag, its port in use, its state
//     directory held by another runtime) fails Spawn at once with its
//     stderr's last lines, instead of being respawned until ctx ends.
//   - Typed calls: Exec and ExecStream (its output as it arrives); CreateSession, GetSession, ListSessions,
//     DeleteSession; the live execs StartExec, WaitExec, KillExec,
//     WriteStdin, ListExecs; the managed processes StartProcess,
//     GetProcess, StopProcess; and the file helpers (ReadFile, Upload, …).
//     Their types (ExecSpec, ExecResult, ExecInfo, SessionInfo,
//     ProcessSpec, ProcessInfo) mirror docs/protocol.md's wire objects;
//     Call and CallStream reach every other method.
//   - Token: Dial without WithToken finds the control token as
//     `boxrt call` does (DiscoverToken): $BOXRT_CONTROL_TOKEN,
//     $LANGBOT_BOX_CONTROL_TOKEN, or for a loopback URL the token a local
//     `boxrt serve` generated in its state directory's control-token
//     (WithStateDir, default DefaultStateDir()).
//   - Streams: CallStream makes a call that streams an exec's output
//     (box_exec or box_exec_start with "stream": true, box_exec_attach) and
//     hands each box_exec_output chunk to a callback of that call, in order,
//     ending with EOF or, when the link drops, a retryable error (the exec
//     goes on in boxrt: re-attach after the reconnect from the next seq).
//     WithOnNotification sees every notification.
//   - Dialed-in runtimes: Listener is an http.Handler for the host's
//     server; it checks each runtime's bearer token against the host's
//     tokens (constant time) and hands one Client per runtime to Accept.
//     A dropped WebSocket is resumed when the runtime dials again: calls
//     in flight keep waiting for their answers, the heartbeat pauses, and
//     calls whose answer (or request) was lost beyond the replay buffers
//     fail with ErrRuntimeUnavailable (docs/protocol.md, "Dial-out
//     runtimes"). Client.HTTP reaches the runtime's relay and files
//     endpoint through streams of the same connection.
//
// Close stops the heartbeat and any reconnect and ends the child or socket;
// when it returns nothing of the Client is left running.
//
// The package imports only boxrt's leaf packages (errors, the token rules,
// the dial-out wire), so embedding it does not pull in the runtime or its
// Docker client. The wire framing is its own: one
// JSON object per line on stdio, one message per text frame on WebSocket
// (github.com/coder/websocket), messages up to 16 MiB, with
// github.com/sourcegraph/jsonrpc2 doing the request bookkeeping.
package reconnect
