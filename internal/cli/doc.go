// Package cli is boxrt's command line (urfave/cli): serve, box (LangBot's
// launcher), call, cp, doctor and version, one file each. It owns what the
// user types: flags, environment variables, defaults, help texts and exit
// statuses (0, 1 for a failure, 2 for a usage or configuration error), and
// reading the configuration and the control token a command is given.
// What serve runs once its flags are read is package server.
package cli
