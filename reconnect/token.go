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
	"unicode/utf8"
)

// tokenEnvs are the variables a control token is taken from, in order: the
// same ones `boxrt serve` and `boxrt call` read.
var tokenEnvs = []string{"BOXRT_CONTROL_TOKEN", "LANGBOT_BOX_CONTROL_TOKEN"}

// controlTokenFile is where, in its state directory, a listening boxrt
// without a configured token keeps the one it generated.
const controlTokenFile = "control-token"

// minTokenLen is the shortest control token boxrt accepts.
const minTokenLen = 32

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
// means DefaultStateDir(). Finding none is not an error: it returns "". A
// token file that exists but cannot be read, or holds no valid token, is.
// Dial uses it unless WithToken is given.
func DiscoverToken(runtimeURL, stateDir string) (string, error) {
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
	for _, env := range tokenEnvs {
		if tok := strings.TrimSpace(os.Getenv(env)); tok != "" {
			return tok, looked, nil
		}
	}
	if !loopbackURL(wsURL) {
		return "", looked + " (a state directory's " + controlTokenFile + " is read only for a loopback runtime URL)", nil
	}
	if stateDir == "" {
		stateDir = DefaultStateDir()
	}
	path := filepath.Join(stateDir, controlTokenFile)
	looked += ", " + path
	tok, err = readTokenFile(path)
	switch {
	case err == nil:
		return tok, looked, nil
	case errors.Is(err, fs.ErrNotExist):
		return "", looked, nil
	}
	return "", looked, fmt.Errorf("reconnect: reading the generated control token: %w (use WithToken or BOXRT_CONTROL_TOKEN)", err)
}

// readTokenFile reads a generated token, held to the rules boxrt serve
// holds a configured one to, so a damaged file is reported here rather
// than as a refusal by the runtime.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("%s: the control token must not contain whitespace", path)
	}
	if n := utf8.RuneCountInString(tok); n < minTokenLen {
		return "", fmt.Errorf("%s: the control token is %d characters long; it must be at least %d", path, n, minTokenLen)
	}
	return tok, nil
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
