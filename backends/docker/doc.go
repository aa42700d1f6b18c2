// Package docker is the Docker Engine backend: one long-lived, hardened
// container per session, commands and managed processes run in it as execs.
//
// It owns everything boxrt does to an engine — image lookup (and a pull
// attempt), container and workspace lifecycle (a named volume, or an ext4
// disk under the state directory when the workspace has a quota, made and
// mounted by backends/internal/loopdisk), the labels that let a restarted boxrt re-adopt its own
// containers (re-checking their host paths and killing the managed
// processes a dead boxrt left behind), the session agent's socket and
// restarts, exec streaming, and killing a command's process tree inside a
// container. Nothing else in boxrt talks to
// Docker.
//
// It speaks the Engine API through github.com/docker/docker/client rather than
// running the docker CLI (as the reference runtime does) because the API gives
// typed errors instead of scraped stderr, streams exec output as it arrives
// without a client process per command, lets a timed-out exec be cancelled
// without losing the session, needs no docker binary on the boxrt host, and
// works unchanged against a remote engine or Podman's Docker-compatible socket
// via DOCKER_HOST.
//
// A session container's PID 1 is the session agent (internal/sandboxagent,
// see agent.go): commands and managed processes are started through it
// over a unix socket bound from the state directory, with pipes or a
// terminal boxrt made, so a command costs no Engine API call; a lost or
// misbehaving agent restarts the container. Where it cannot serve (gVisor
// whose runtime the engine runs without host unix sockets, a terminal
// command on gVisor, a remote engine, another process user, containers of
// an older boxrt)
// commands run as Engine execs: a plain one in an exec started after the
// session's previous one (a shell waiting for its command line, see
// prestart.go), paying the exec's start between commands.
//
// Killing inside the container without the agent is done with small POSIX sh scripts that use
// only shell builtins (read, kill, test) to walk /proc, so they work in a
// busybox-only image, on kernels without /proc/<pid>/task/*/children, and
// while a fork bomb holds every pid the container's pids limit allows.
package docker
