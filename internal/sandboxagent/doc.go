// Package sandboxagent is the session agent and boxrt's side of it.
//
// A session's sandbox runs boxrt's own binary as its PID 1 ("boxrt agent
// --connect PATH"). The agent dials a unix socket the host listens on,
// introduces itself with a hello, and then starts processes inside the
// sandbox when the host asks (spawn), signals their process groups
// (signal) and reports their ends (exited). The host creates every pipe and
// pty itself and passes the child's ends over the socket (SCM_RIGHTS), so
// a command's output never flows through the agent, with one exception: a
// sandbox whose kernel does not take a host terminal (gVisor) gets a
// terminal the agent makes in the sandbox and relays to a stdin and an
// output pipe of the host's (term; ptyrelay.go), copying bytes and
// nothing else.
//
// The wire: a frame is a 4-byte big-endian length and that many bytes (at
// most 64 KiB) of one JSON object whose "op" names its type; descriptors
// ride on a frame's bytes, at most 3.
//
//	agent → host  hello   {version, pid}          first, within 5 s
//	host → agent  spawn   {id, argv, env, dir, tty, term} + stdin, stdout, stderr
//	                      (with tty: the pty slave; with term {rows, cols}: the stdin
//	                      pipe's read end and the output pipe's write end)
//	agent → host  started {id, pid} | failed {id, error}   within 5 s
//	agent → host  exited  {id, code, signal}
//	host → agent  signal  {id, signal}            to the process's group; no answer
//	host → agent  resize  {id, rows, cols}        the term's size, 1..65535 each
//	                      (or a stream-mode process's terminal)
//	agent → host  resized {id}                    within 5 s, in order
//	host → agent  arg     {id, data}              ahead of a spawn or run with
//	                      long_arg: pieces of its last argument, up to 128 KiB
//	                      (longarg.go), when it does not fit a frame
//
// The agent runs next to the session's code, as the same user: the host
// treats everything it says as hostile. Frames are bounded, decoded
// strictly (a type per op, unknown fields refused), validated, and every
// wait for an answer has a deadline; a descriptor the agent sends is
// closed. A violation is a *ProtocolError and ends the connection; a lost
// connection is ErrAgentLost. Either fails every pending Proc.Wait.
//
// Stream mode (streammsg.go) serves a sandbox boxrt reaches only by
// running commands in it, a Kubernetes Pod: the agent listens there
// ("boxrt agent --listen PATH"), an exec of "boxrt agent --bridge PATH"
// joins the exec's stdin and stdout to it, and Bridge speaks the protocol
// through them. No descriptor crosses, so Run has the agent make the pipes
// or terminal and carry the bytes as windowed output, input and credit
// frames, checked as strictly as the rest.
//
// DrainReader (drain.go) is how both sides read a command's output once
// it has exited: after a deadline for what a background holder of the pipe
// may still write, what the pipe holds is taken without waiting, so a slow
// reader never loses output the command wrote before its exit.
//
// Ids belong to one connection. When it drops, the agent's children keep
// running and the agent dials again; a new connection (a restarted boxrt
// counts ids from 1 again) knows none of them, and their exits are reaped
// without being reported.
//
// It is a leaf: it imports the standard library, golang.org/x/sys/unix,
// internal/fdsafe (another leaf) and github.com/creack/pty (in its tests).
package sandboxagent
