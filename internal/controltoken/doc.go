// Package controltoken holds the rules of the control token, the bearer
// credential every authenticated route checks: how long it must be, and
// how a generated one is kept in the state directory (a private file
// written atomically) so that a local client finds it. serve generates and
// reads it there, call and cp read it. It imports nothing of boxrt but the
// atomic file writer.
package controltoken
