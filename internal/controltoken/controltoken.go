package controltoken

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/boxrt/boxrt/internal/atomicfile"
)

// FileName is the file in the state directory that holds the control
// token boxrt generated for a --listen runtime.
const FileName = "control-token"

// MinLen is the shortest control token boxrt accepts, counted in
// characters. The token guards command execution in every session, so a
// guessable one is refused at start rather than warned about (the
// reference runtime has the same rule).
const MinLen = 32

// Check validates a token; from names its source (the flag with its file,
// or the environment variable) so the error says which setting to fix.
func Check(from, tok string) error {
	if strings.ContainsAny(tok, " \t\r\n") {
		return fmt.Errorf("%s: the control token must not contain whitespace", from)
	}
	if n := utf8.RuneCountInString(tok); n < MinLen {
		return fmt.Errorf("%s: the control token is %d characters long; it must be at least %d (generate one with: openssl rand -base64 48)", from, n, MinLen)
	}
	return nil
}

// Random makes up a token: 32 random bytes, base64url.
func Random() string {
	buf := make([]byte, 32)
	rand.Read(buf) // never fails: crypto/rand crashes the program instead
	return base64.RawURLEncoding.EncodeToString(buf)
}

// ReadFile reads a generated token file. private refuses a file that is
// not a regular file only its owner can read: such a token may be known to
// others and is replaced rather than reused.
func ReadFile(path string, private bool) (string, error) {
	if private {
		fi, err := os.Lstat(path)
		if err != nil {
			return "", err
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("%s is not a private regular file", path)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if err := Check(path, tok); err != nil {
		return "", err
	}
	return tok, nil
}

// WriteFile keeps tok in path, mode 0600, creating its directory (0700);
// a crash never leaves a half-written token behind.
func WriteFile(path, tok string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, []byte(tok+"\n"), 0o600)
}
