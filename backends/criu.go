package backends

import (
	"context"
	"errors"
	"os/exec"
	"strings"
)

// CRIUCheck runs `criu check` on this host (where bwrap sandboxes run and a
// local Docker engine's runc would run CRIU) and returns nil when CRIU can
// checkpoint here, else an error whose message is CRIU's own first error
// line, or that criu is not installed.
func CRIUCheck(ctx context.Context) error {
	path, err := exec.LookPath("criu")
	if err != nil {
		return errors.New("criu is not installed (apt-get install criu)")
	}
	out, err := exec.CommandContext(ctx, path, "check").CombinedOutput()
	if err == nil {
		return nil
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "Error") {
			return errors.New("criu check: " + strings.TrimSpace(line))
		}
	}
	return errors.New("criu check: " + strings.TrimSpace(string(out)) + " (" + err.Error() + ")")
}
