// Package sandboxagent is the session agent and boxrt's side of it.
//
// A session's sandbox runs boxrt's own binary as its PID 1 ("boxrt agent
// --connect PATH"). The agent dials a unix socket the host listens on,
// introduces itself with a hello, and then starts processes inside the
// sandbox when the host asks (spawn), signals their process groups
// (signal) and reports their ends (exited). The host creates every pipe and
// pty itself and passes the child's ends over the socket (SCM_RIGHTS), so
// a command's output never flows through the agent.
//
// The agent runs next to the session's code, as the same user: the host
// treats everything it says as hostile. Frames are bounded (4-byte
// big-endian length, at most 64 KiB of JSON), decoded strictly, validated,
// and every wait for an answer has a deadline; a descriptor the agent sends
// is closed. A violation is a *ProtocolError and ends the connection; a
// lost connection is ErrAgentLost. Either fails every pending Proc.Wait.
//
// It is a leaf: it imports the standard library, golang.org/x/sys/unix
// and github.com/creack/pty only.
package sandboxagent
