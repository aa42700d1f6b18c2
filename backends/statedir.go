package backends

import (
	"errors"
	"syscall"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// StateDirError is the typed error of a write to the state directory that
// failed: what was being done and why, and for a full disk (or quota) what
// to do about it, since that is the operator's to fix, not the caller's.
func StateDirError(what string, err error) *boxerr.Error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return boxerr.Failure("%s: %v: the state directory's filesystem is full; free space there or start boxrt with another --state-dir",
			what, err).With("reason", "no_space").Wrap(err)
	}
	return boxerr.Failure("%s: %v", what, err).Wrap(err)
}
