package reconnect

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// realBin is the boxrt binary built from this module for the real-binary
// tests; "" when it could not be built (they skip) or with -short.
var (
	realBin      string
	realBinError string
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeChildEnv) != "" {
		runFakeChild()
		os.Exit(0)
	}
	flag.Parse()
	var dir string
	if !testing.Short() {
		dir, realBin, realBinError = buildBoxrt()
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}))
}

// buildBoxrt runs `go build -o <tmp>/boxrt <module root>`.
func buildBoxrt() (dir, bin, failure string) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		return "", "", err.Error()
	}
	dir, err = os.MkdirTemp("", "reconnect-boxrt-")
	if err != nil {
		return "", "", err.Error()
	}
	bin = filepath.Join(dir, "boxrt")
	out, err := exec.Command(goTool, "build", "-o", bin, root).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "reconnect: building boxrt failed; real-binary tests will skip:\n%s\n", out)
		return dir, "", fmt.Sprintf("go build failed: %v: %s", err, out)
	}
	return dir, bin, ""
}

// testImage is the image the real-binary tests' docker sessions use: the
// small busybox image scripts/setup builds (scripts/build-test-image), not
// the default boxrt-sandbox:latest, which these tests do not need.
func testImage() string {
	if img := os.Getenv("BOXRT_TEST_IMAGE"); img != "" {
		return img
	}
	return "boxrt-test:busybox"
}

// realEnv is the environment of a real boxrt child: this process's, with
// a configuration that points the docker backend at testImage. bwrap, the
// fallback when no engine answers, ignores it.
func realEnv() []string {
	return append(os.Environ(), fmt.Sprintf(`BOXRT_CONFIG={"docker":{"image":%q}}`, testImage()))
}

func needRealBinary(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("real-binary test skipped in -short mode")
	}
	if realBin == "" {
		t.Fatal("building the boxrt binary failed: " + realBinError)
	}
}
