// Package fdsafe keeps descriptors boxrt inherited from its parent out of
// every process boxrt starts. A host that spawns boxrt with a descriptor
// left open (a file, a directory, a pipe or a socket without
// close-on-exec) would otherwise hand it on to bwrap and, through bwrap,
// to every sandbox, and to every command of the host backend: a command
// could then write into the host's file or read the host's directory
// through /proc/self/fd. main calls Seal before anything else runs.
// It is a leaf: it imports nothing of boxrt.
package fdsafe
