package skills

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

// testStore returns a store on a fresh root, its real root path and its
// private temp parent.
func testStore(t *testing.T, opts ...Option) (*Store, string) {
	t.Helper()
	return testStoreLimits(t, DefaultLimits(), opts...)
}

func testStoreLimits(t *testing.T, lim Limits, opts ...Option) (*Store, string) {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "skills")
	s := New(func() string { return root }, func() Limits { return lim },
		append([]Option{WithTempDir(filepath.Join(base, "tmp"))}, opts...)...)
	t.Cleanup(func() { _ = s.Close() })
	real, err := s.Root(bg)
	if err != nil {
		t.Fatal(err)
	}
	return s, real
}

func ptr[T any](v T) *T { return &v }

// mustCreate creates a skill or fails the test.
func mustCreate(t *testing.T, s *Store, name, instructions string) Skill {
	t.Helper()
	sk, err := s.Create(bg, Input{Name: ptr(name), Description: ptr("about " + name), Instructions: ptr(instructions)})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return sk
}

// wantValidation fails unless err is a BoxValidationError whose message
// contains every fragment.
func wantValidation(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want a validation error containing %q, got success", fragments)
	}
	var be *boxerr.Error
	if !errors.As(err, &be) || !errors.Is(err, boxerr.ErrValidation) {
		t.Fatalf("want BoxValidationError, got %T %v", err, err)
	}
	for _, f := range fragments {
		if !strings.Contains(be.Msg, f) {
			t.Fatalf("error %q does not contain %q", be.Msg, f)
		}
	}
}

// snapshot describes a tree byte for byte: every path with its type,
// permissions, and content hash or link target.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			lines = append(lines, fmt.Sprintf("L %s -> %s", rel, target))
		case fi.IsDir():
			lines = append(lines, fmt.Sprintf("D %s %v", rel, fi.Mode()))
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			lines = append(lines, fmt.Sprintf("F %s %v %s", rel, fi.Mode(), hex.EncodeToString(sum[:])))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// zipFile is one entry for buildZip.
type zipFile struct {
	name string
	body string
	mode fs.FileMode // 0: regular 0644
}

// buildZip makes an archive in memory with archive/zip.
func buildZip(t *testing.T, files ...zipFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	for _, f := range files {
		h := &zip.FileHeader{Name: f.name, Method: zip.Deflate}
		mode := f.mode
		if mode == 0 {
			mode = 0o644
		}
		h.SetMode(mode)
		if strings.HasSuffix(f.name, "/") {
			h.Method = zip.Store
		}
		fw, err := w.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fw.Write([]byte(f.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func skillMD(name, desc, body string) string {
	return fmt.Sprintf("---\nname: %s\ndescription: %s\n---\n\n%s", name, desc, body)
}

// writeFile creates a file (and its parents) for fixtures.
func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
