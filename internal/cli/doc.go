// Package cli is boxrt's command line (urfave/cli): serve, mcp (serve's
// runtime as MCP tools), box (LangBot's launcher), call, exec, sessions,
// cp, doctor, version and the hidden agent (the sandbox's PID 1, package
// sandboxagent), one file each;
// target.go finds the runtime the client commands reach, flags.go lets
// every command take its flags after its arguments. It owns what the
// user types: flags, environment variables, defaults, help texts and exit
// statuses (0, 1 for a failure, 2 for a usage or configuration error), and
// reading the configuration and the control token a command is given.
// What serve and mcp run once their flags are read is package server.
package cli
