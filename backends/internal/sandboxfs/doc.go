// Package sandboxfs is the file API (runtime.FileSystem) of the container
// backends (docker, kube), shared: both run one small shell script (Script)
// per call inside the session's container, through their own exec API
// (Engine exec, Pod exec subresource), as the session's user. So every
// path is resolved by the container's own kernel in the container's own
// root — its read-only rootfs, its workspace, its /tmp and its extra
// mounts as the sandbox sees them — and permissions and file owners are
// the sandboxed user's.
//
// The script resolves each path with readlink -f (the longest existing
// prefix; the rest is to be created) and refuses a result outside the
// session's mounts, which it gets as arguments: the rules are those of
// backends/files.go. A symlink swapped in between that check and the
// operation can only lead to another place in the container itself,
// never to the host.
//
// Data streams through the exec's stdin and stdout, so no call holds a
// whole file in memory. A backend supplies a Runner (start one command,
// stream it, report its exit code); FS does the rest.
package sandboxfs
