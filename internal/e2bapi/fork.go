package e2bapi

import (
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

// maxForks is E2B's bound on count.
const maxForks = 100

// forkResult is SandboxForkResult: one fork's sandbox or its error.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// fork is POST /sandboxes/{id}/fork: count copies of the sandbox's files
// (box_fork_session), each a new sandbox with the source's template, envs
// and metadata. Unlike E2B's, a fork does not carry the source's memory:
// its processes do not run in the copy.
func (h *Handler) fork(w http.ResponseWriter, r *http.Request) {
	body := struct {
		Timeout *int `json:"timeout"`
		Count   *int `json:"count"`
	}{}
	timeout, ok := optionalBody(w, r, &body, &body.Timeout)
	if !ok {
		return
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > maxForks {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("count must be between 1 and %d, got %d", maxForks, count))
		return
	}
	h.withSandbox(w, r, func(src *sandbox, _ runtime.SessionInfo) {
		out := make([]forkResult, 0, count)
		for range count {
			out = append(out, h.forkOne(r, src, timeout))
		}
		writeJSON(w, http.StatusCreated, out)
	})
}

func (h *Handler) forkOne(r *http.Request, src *sandbox, timeout time.Duration) forkResult {
	ctx := r.Context()
	id := newSandboxID()
	info, err := h.rt.Snapshots().Fork(ctx, src.logical, id)
	if err == nil {
		var sb *sandbox
		first := sandboxInit{template: src.template, envs: maps.Clone(src.envs), metadata: maps.Clone(src.metadata), autoPause: src.autoPause,
			timeout: timeout}
		if sb, err = h.adopt(ctx, id, info, first); err == nil {
			j := sb.json()
			return forkResult{Sandbox: &j}
		}
	}
	return forkResult{Error: &apiError{Code: boxerr.HTTPStatus(err), Message: err.Error()}}
}
