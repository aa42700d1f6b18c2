// Package statelock gives one process at a time a state directory: boxrt
// keeps its instance id there, and the sandboxes labelled with that id
// belong to whichever runtime opens the directory. Two runtimes on one
// directory would adopt, and at exit destroy, each other's sessions, so
// every command that opens a runtime holds an exclusive flock on
// <dir>/lock for its whole life. It is a leaf: it imports nothing of
// boxrt.
package statelock
