// Package kube runs sessions as Pods on a Kubernetes cluster through the API
// server (client-go), for operators who need more than one machine.
//
// A session is one Pod in the configured namespace. Everything boxrt needs to
// serve it again lives on the Pod itself (labels and annotations: instance,
// logical session id, sandbox spec and its hash, created/last-used), and the
// Pod's name is derived from a hash of the instance and session ids, so any
// boxrt replica pointed at the same namespace with the same instance id can
// serve any session: two replicas creating the same session race on the
// name, one create wins and the other adopts the winner's Pod.
//
// Commands run through the session agent in the Pod (agent.go): boxrt's
// own binary, uploaded into an emptyDir the container's main process waits
// on, reached through one long-lived exec per Pod ("boxrt agent --bridge")
// that carries the agent protocol's stream mode. Where the agent cannot
// run, and for managed processes, live execs' helpers and the file API,
// they run through the Pod exec subresource
// (client-go remotecommand over WebSocket, SPDY only where the server lacks
// it), one exec each, wrapped in the same shell snippets as the docker backend (sandboxsh):
// a watcher reading the exec's stdin kills the command's process tree on a
// timeout, or when the exec stream breaks, and the Pod stays. Live execs
// (stdin, a terminal, signals) and the file API (backends/internal/sandboxfs)
// work as on docker, through the same subresource: signals, resize checks
// and sweeps are helper execs.
//
// Suspension deletes a persistent session's Pod and keeps its
// PersistentVolumeClaims (the workspace's, which carries the suspended mark
// and the Pod's session annotations, so the API server alone still says
// what the session is, and /tmp's); resume recreates the Pod on them.
// Snapshots and forks move the workspace and /tmp as a tar stream through
// an exec (tar in the Pod). boxrt's own pid files live in /run/boxrt, an
// in-memory emptyDir of its own, out of the user's directories.
//
// Warm pools (pool.go): pooled Pods get random names, and a session claimed
// from a pool is found through an index ConfigMap of the session's derived
// name, created and committed with resourceVersion-guarded writes, so a
// claim and a cold create of one session still end with exactly one Pod.
//
// Network off is a NetworkPolicy denying all ingress and egress of the Pod,
// which only a CNI that enforces NetworkPolicy turns into a real barrier.
package kube
