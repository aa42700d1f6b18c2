package e2bapi

import (
	"net/http"

	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// snapshotJSON is SnapshotInfo. boxrt's snapshots have no names: names
// holds the id, which create takes as a templateID.
type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// snapshot is POST /sandboxes/{id}/snapshots: box_snapshot_session of
// the sandbox's files (its name, if any, is not kept).
func (h *Handler) snapshot(w http.ResponseWriter, r *http.Request) {
	h.withSandbox(w, r, func(sb *sandbox, _ runtime.SessionInfo) {
		m, err := h.rt.Snapshots().Take(r.Context(), sb.logical, "")
		if err != nil {
			writeRuntimeError(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, snapshotJSON{SnapshotID: m.ID, Names: []string{m.ID}})
	})
}

// listSnapshots is GET /snapshots[?sandboxID=…&name=…]: the caller's
// snapshots, newest last; no pagination.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ms, err := h.rt.Snapshots().List(ctx)
	if err != nil {
		writeRuntimeError(w, err)
		return
	}
	source, name := r.URL.Query().Get("sandboxID"), r.URL.Query().Get("name")
	out := []snapshotJSON{}
	for _, m := range ms {
		if (source != "" && tenant.Logical(ctx, m.SessionID) != source) || (name != "" && name != m.ID) {
			continue
		}
		out = append(out, snapshotJSON{SnapshotID: m.ID, Names: []string{m.ID}})
	}
	writeJSON(w, http.StatusOK, out)
}
