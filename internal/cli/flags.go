package cli

import (
	"os"
	"path/filepath"
)

// defaultStateDir is the --state-dir default of every command: one
// runtime's directory, found by serve, call, cp and doctor alike.
func defaultStateDir() string {
	if d := os.Getenv("BOXRT_STATE_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/boxrt"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "boxrt")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "boxrt")
	}
	return filepath.Join(os.TempDir(), "boxrt")
}
