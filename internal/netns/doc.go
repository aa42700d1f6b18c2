// Package netns runs code on a thread inside another network namespace, so
// the sockets it makes belong to that namespace (a session's egress
// listeners, a dial to a port a session listens on) while the rest of
// boxrt stays in its own.
package netns
