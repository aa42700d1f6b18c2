// Package execproc holds what the container backends (docker, kube) share
// around a command they run through an exec API (Engine exec, Pod exec
// subresource): the wait of a box_exec command for its end, its timeout or
// its cancellation (Await), the stream and completion half of a managed
// process (backends.Process), and the bounded buffer that captures a
// helper's output. Each backend keeps what differs: how the exec is
// started, its stdin, signalling, killing, and reading the exit code.
package execproc
