// Package agentboot gives the session agent one processor before the rest
// of boxrt's binary initializes.
//
// The agent is boxrt's own binary ("boxrt agent …"), and its threads share
// the sandbox's pids limit with the session's commands: backends add
// sandboxagent.MaxThreads to the limit for them. The Go runtime makes
// threads by the number of processors, and the binary's package
// initialization (client libraries, protobuf registries) allocates enough
// to run the garbage collector on all of them, so on a many-core host the
// agent would start with dozens of threads before its own code ran.
// Setting GOMAXPROCS in the agent's environment would avoid that, but a
// container's PID 1 environment is also the one its commands inherit.
//
// So this package's init does it: Go initializes packages in import-path
// order, each once its imports are, and this one imports only the standard
// library's os and runtime, so it runs before any of boxrt's heavier
// dependencies. It is imported by sandboxagent, so every binary that can
// act as the agent (boxrt, and test binaries through RunIfAgent) has it.
package agentboot
