// Package sandboxsh holds the POSIX shell snippets the container backends
// (docker, kube) run inside a sandbox to start commands and managed
// processes and to kill their whole process trees. Both backends exec into
// a long-lived container through an API (Engine exec, Pod exec subresource)
// and need the same wrappers, so they live here once. The bwrap backend
// uses PrestartHead and PrestartLine for its prestarted exec.
package sandboxsh
