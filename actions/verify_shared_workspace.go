package actions

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// probeName is the only basename LangBot writes as its shared-workspace
// marker.
var probeName = regexp.MustCompile(`^\.langbot-box-volume-probe-[a-f0-9]{32}$`)

// maxProbeBytes bounds the marker file.
const maxProbeBytes = 1024

type probeParams struct {
	MarkerName string `json:"marker_name"`
}

type probeResult struct {
	MarkerName string `json:"marker_name"`
	SHA256     string `json:"sha256"`
	Size       int    `json:"size"`
}

// verifySharedWorkspace: box_verify_shared_workspace {"marker_name"} →
// {"marker_name", "sha256", "size"}. LangBot writes a random marker into
// the volume it shares with the runtime and checks that boxrt reads the
// same bytes from its managed workspace root (local.default_workspace).
// The marker is opened under the root without following symlinks; every
// failure is a BoxReadinessError, as in the reference.
func (t *Tenancy) verifySharedWorkspace(_ context.Context, p probeParams) (probeResult, error) {
	name := strings.TrimSpace(p.MarkerName)
	if !probeName.MatchString(name) {
		return probeResult{}, boxerr.Readiness("Invalid Box shared Workspace probe basename")
	}
	root, err := os.OpenRoot(t.rt.Config().DefaultWorkspace())
	if err != nil {
		return probeResult{}, boxerr.Readiness("Box Runtime cannot read the Core shared Workspace probe").Wrap(err)
	}
	defer root.Close()
	fi, err := root.Lstat(name)
	if err != nil {
		return probeResult{}, boxerr.Readiness("Box Runtime cannot read the Core shared Workspace probe").Wrap(err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return probeResult{}, boxerr.Readiness("Box shared Workspace probe is not a regular file")
	case fi.Size() < 1:
		return probeResult{}, boxerr.Readiness("Box shared Workspace probe has an invalid size")
	case fi.Size() > maxProbeBytes:
		return probeResult{}, boxerr.Readiness("Box shared Workspace probe exceeds the size limit")
	}
	f, err := root.Open(name)
	if err != nil {
		return probeResult{}, boxerr.Readiness("Box Runtime cannot read the Core shared Workspace probe").Wrap(err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxProbeBytes+1))
	if err != nil {
		return probeResult{}, boxerr.Readiness("Box Runtime cannot read the Core shared Workspace probe").Wrap(err)
	}
	if int64(len(data)) != fi.Size() {
		return probeResult{}, boxerr.Readiness("Box shared Workspace probe changed while being verified")
	}
	sum := sha256.Sum256(data)
	return probeResult{MarkerName: name, SHA256: hex.EncodeToString(sum[:]), Size: len(data)}, nil
}
