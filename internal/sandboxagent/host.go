package sandboxagent

import (
	"context"
	"errors"
	"os"
	"syscall"
)

// SocketName is the name of the socket Listen creates in its directory.
const SocketName = "agent.sock"

// ErrAgentLost is the error of a connection that ended without a protocol
// violation (the agent exited, was killed, or the host closed the Conn),
// and of every Proc.Wait pending when it ended.
var ErrAgentLost = errors.New("sandbox agent lost")

// ProtocolError is what the agent said wrong (or failed to say in time).
// The connection that carried it is closed.
type ProtocolError struct{ Reason string }

func (e *ProtocolError) Error() string { return "sandbox agent protocol error: " + e.Reason }

// SpawnError is the agent's refusal to start a process (argv[0] not found,
// the directory missing, …); the connection stays usable.
type SpawnError struct{ Reason string }

func (e *SpawnError) Error() string { return "cannot start the process in the sandbox: " + e.Reason }

var errNotImplemented = errors.New("sandboxagent: not implemented yet")

// Listener is a session's listening socket.
type Listener struct{}

// Listen creates the listening socket dir/agent.sock (mode 0666, so that
// the sandbox user can connect), removing a stale socket file an earlier
// boxrt left there. dir may be of any length: the socket is bound through
// /proc/self/fd, never by its full path.
func Listen(dir string) (*Listener, error) { return nil, errNotImplemented }

// Accept waits for an agent to connect and say a valid hello (at most 5 s
// after it connected) and returns its connection.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) { return nil, errNotImplemented }

// Close stops listening and removes the socket file.
func (l *Listener) Close() error { return errNotImplemented }

// Conn is one agent's connection. One reader goroutine demultiplexes the
// agent's answers by spawn id.
type Conn struct{}

// AgentPID is the pid the agent said it has in the sandbox (validated to
// be in 1..4194304; it is the agent's word, nothing more).
func (c *Conn) AgentPID() int { return 0 }

// Spawn asks the agent to start req and waits (at most 5 s, and ctx) for
// it to say started or failed. A refusal is a *SpawnError. When ctx ends
// first, a process the agent starts after all is killed.
func (c *Conn) Spawn(ctx context.Context, req SpawnRequest) (*Proc, error) {
	return nil, errNotImplemented
}

// Done is closed when the connection is lost or closed.
func (c *Conn) Done() <-chan struct{} { return nil }

// Err is nil while the connection is up, then ErrAgentLost or a
// *ProtocolError.
func (c *Conn) Err() error { return errNotImplemented }

// Close closes the connection; pending Waits get ErrAgentLost. The
// agent's processes keep running.
func (c *Conn) Close() error { return errNotImplemented }

// SpawnRequest is a process to start in the sandbox.
type SpawnRequest struct {
	Argv []string // argv[0] without a slash is looked up in Env's PATH
	Env  []string // the complete environment, KEY=VALUE
	Dir  string   // the working directory in the sandbox; must exist ("" is /)
	// TTY: Stdin is a pty slave, made the controlling terminal and the
	// child's stdin, stdout and stderr; Stdout and Stderr must be nil.
	TTY bool
	// The child's ends; nil is /dev/null in the sandbox. Spawn does not
	// close them: the caller closes its copies once Spawn returned.
	Stdin, Stdout, Stderr *os.File
}

// Proc is a process the agent started.
type Proc struct{}

// PID is the process's pid in the sandbox's pid namespace.
func (p *Proc) PID() int { return 0 }

// Wait waits for the process to exit. It returns ErrAgentLost or a
// *ProtocolError when the connection ended first, ctx.Err() when ctx did.
func (p *Proc) Wait(ctx context.Context) (Exit, error) { return Exit{}, errNotImplemented }

// Signal asks the agent to send sig to the process's group (the process
// is a session leader, its pgid is its pid), so that what it left in the
// background gets it too. The agent does not answer; a kill that must
// happen is the host's (the sandbox's cgroup or pid namespace).
func (p *Proc) Signal(sig syscall.Signal) error { return errNotImplemented }

// Exit is how a process ended.
type Exit struct {
	Code   int // 0..255; 128+Signal when killed by a signal
	Signal int // 0 unless killed by a signal
}
