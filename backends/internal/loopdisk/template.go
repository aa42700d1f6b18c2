package loopdisk

import (
	"os"
	"path/filepath"
	"sync"
)

// Template is an image formatted once, on first use, which disks of its
// size are copies of (CopySparse): much cheaper than mkfs.ext4 for each.
// It is never mounted; every copy is one disk's alone. (The copies share
// the filesystem's UUID, which neither the kernel nor boxrt uses.) The
// zero Template is ready to use.
type Template struct {
	mu     sync.Mutex
	path   string // the made template, "" until then
	closed bool
}

// Get returns the template, made at path by format on the first call.
// After Close it returns "": Close has removed the template (or is about
// to, waiting for the lock) and nothing would remove one made after it.
func (t *Template) Get(path string, format func(path string) error) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", nil
	}
	if t.path != "" {
		return t.path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	_ = os.Remove(path) // a half-made one of an earlier failure
	if err := format(path); err != nil {
		_ = os.Remove(path)
		return "", err
	}
	t.path = path
	return path, nil
}

// Close removes the template; Get makes none after it.
func (t *Template) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.path != "" {
		_ = os.Remove(t.path)
		t.path = ""
	}
}
