// Package agenttest gives tests a static boxrt binary to run as the
// session agent inside a sandbox, where the host's libraries may be
// missing.
package agenttest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	once     sync.Once
	built    string
	buildErr error
)

// Binary builds (once per test process, cached under os.TempDir by
// content) a static boxrt binary (CGO_ENABLED=0 go build of the module
// root) and returns its path; tests that need an agent inside a sandbox
// mount it. A failed build fails t with the build's output.
func Binary(t testing.TB) string {
	t.Helper()
	once.Do(func() { built, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("agenttest: %v", buildErr)
	}
	return built
}

// build runs go build (itself cached: seconds once it has run) into the
// cache directory and renames the result to its content's hash, so test
// processes running at once share one file and never see half of one.
func build() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cache, err := cacheDir()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "boxrt")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("CGO_ENABLED=0 go build in %s: %v\n%s", root, err, b)
	}
	sum, err := hashOf(out)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(cache, "boxrt-agent-"+sum[:16])
	if err := os.Rename(out, dst); err != nil {
		return "", err
	}
	prune(cache)
	return dst, nil
}

// staleAfter is the age past which another build's binary goes: no test
// process still uses it, and the cache does not grow with every change.
const staleAfter = 24 * time.Hour

// prune removes the binaries and abandoned builds of long ago.
func prune(cache string) {
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleAfter {
			os.RemoveAll(filepath.Join(cache, e.Name()))
		}
	}
}

// moduleRoot is the directory of the go.mod of the test's package.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD (is go on PATH?): %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("the test does not run inside the boxrt module")
	}
	return filepath.Dir(gomod), nil
}

// cacheDir is this user's cache directory under os.TempDir. It is
// readable by all (a sandbox user runs the binary) and writable only by
// this user, who must own it: a directory someone else made there is not
// trusted.
func cacheDir() (string, error) {
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("boxrt-agenttest-%d", os.Getuid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return "", err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || !ok || int(sys.Uid) != os.Getuid() || st.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("%s is not a directory of this user's that only it can write; remove it", dir)
	}
	return dir, nil
}

func hashOf(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
