package reconnect

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/boxrt/boxrt/internal/controltoken"
)

// tokenEnvs are the variables a control token is taken from, in order: the
// same ones `boxrt serve` and `boxrt call` read.
var tokenEnvs = []string{"BOXRT_CONTROL_TOKEN", "LANGBOT_BOX_CONTROL_TOKEN"}

// DefaultStateDir is the state directory `boxrt serve` uses when not told
// otherwise: $BOXRT_STATE_DIR, else /var/lib/boxrt for root, else
// $XDG_STATE_HOME/boxrt or ~/.local/state/boxrt (boxrt under the temporary
// directory when there is no home). A local runtime started without a
// configured token keeps its generated one there (see DiscoverToken).
func DefaultStateDir() string {
	if d := os.Getenv(stateDirEnv); d != "" {
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

// DiscoverToken finds the control token for the runtime at runtimeURL the
// way `boxrt call` does: $BOXRT_CONTROL_TOKEN, else
// $LANGBOT_BOX_CONTROL_TOKEN, else, when runtimeURL names this machine by a
// loopback name (where a runtime sharing the state directory may listen),
// the token that runtime generated in stateDir/control-token; stateDir ""
// means DefaultStateDir(). runtimeURL "" (a runtime yet to be spawned)
// consults the environment only. Finding none is not an error: it returns
// "". A token file that exists but cannot be read, or holds no valid
// token, is. Dial uses it unless WithToken is given.
func DiscoverToken(runtimeURL, stateDir string) (string, error) {
	if strings.TrimSpace(runtimeURL) == "" {
		return envToken(), nil
	}
	u, err := normalizeURL(runtimeURL)
	if err != nil {
		return "", err
	}
	tok, _, err := discoverToken(u, stateDir)
	return tok, err
}

// discoverToken is DiscoverToken on a normalised URL that also says where
// it looked, for the error of a runtime that wants a token when none was
// found.
func discoverToken(wsURL, stateDir string) (tok, looked string, err error) {
	looked = "$" + strings.Join(tokenEnvs, ", $")
	if tok := envToken(); tok != "" {
		return tok, looked, nil
	}
	if !loopbackURL(wsURL) {
		return "", looked + " (a state directory's " + controltoken.FileName + " is read only for a loopback runtime URL)", nil
	}
	if stateDir == "" {
		stateDir = DefaultStateDir()
	}
	path := filepath.Join(stateDir, controltoken.FileName)
	looked += ", " + path
	tok, err = controltoken.ReadFile(path, false)
	switch {
	case err == nil:
		return tok, looked, nil
	case errors.Is(err, fs.ErrNotExist):
		return "", looked, nil
	}
	return "", looked, fmt.Errorf("reconnect: reading the generated control token: %w", err)
}

// envToken is the control token the environment names, or "".
func envToken() string {
	for _, env := range tokenEnvs {
		if tok := strings.TrimSpace(os.Getenv(env)); tok != "" {
			return tok
		}
	}
	return ""
}

// loopbackURL reports whether a normalised runtime URL names this machine
// by a loopback name.
func loopbackURL(wsURL string) bool {
	u, err := url.Parse(wsURL)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
