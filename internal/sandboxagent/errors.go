package sandboxagent

import "errors"

// ErrAgentLost is the error of a connection that ended without a protocol
// violation (the agent exited, was killed, or the host closed the Conn),
// and of every Proc.Wait pending when it ended.
var ErrAgentLost = errors.New("sandbox agent lost")

// ProtocolError is what the agent said wrong (or failed to say in time).
// The connection that carried it is closed.
type ProtocolError struct{ Reason string }

func (e *ProtocolError) Error() string { return "sandbox agent protocol error: " + e.Reason }

// SpawnError is the agent's refusal to start a process (argv[0] not found,
// the directory missing, …); the connection stays usable. Reason is the
// agent's text, bounded and not to be trusted further than that.
type SpawnError struct{ Reason string }

func (e *SpawnError) Error() string { return "cannot start the process in the sandbox: " + e.Reason }
