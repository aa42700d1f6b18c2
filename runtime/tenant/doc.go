// Package tenant is the namespace a request runs in, carried in its
// context the way containerd carries namespaces: the tenancy layer puts a
// Workspace's Placement into the context once, and every store of the
// runtime (sessions, execs, snapshots, watches, managed processes) resolves
// the ids a caller names within it. A context without a placement is the
// default namespace (single-tenant callers), which can never name a
// Workspace's physical id.
//
// It is a leaf: it imports internal/boxerr and nothing else of boxrt, so the
// runtime, the relay and the actions can all use it.
package tenant
