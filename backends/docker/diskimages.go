package docker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/boxrt/boxrt/backends/internal/loopdisk"
)

// templateDir is where this Backend keeps its disk templates: a directory
// of its own, "" without a state directory.
func (b *Backend) templateDir() string {
	if b.stateDir == "" {
		return ""
	}
	return filepath.Join(b.stateDir, "docker", b.instance, templatesDir, randomHex(8))
}

// diskImages makes the sessions' disk images: copies of a template for
// the configured sizes, formatted otherwise.
type diskImages struct {
	dir   string                     // this Backend's templates
	tmpls map[int]*loopdisk.Template // by size in MiB

	mkfsOnce sync.Once
	mkfs     string
	mkfsErr  error
}

// newDiskImages keeps templates in dir for the sizes given (0 is none;
// so is every size when dir is "").
func newDiskImages(dir string, sizesMB ...int) *diskImages {
	d := &diskImages{dir: dir, tmpls: map[int]*loopdisk.Template{}}
	for _, mb := range sizesMB {
		if mb > 0 && dir != "" {
			d.tmpls[mb] = &loopdisk.Template{}
		}
	}
	return d
}

// image makes a new disk image of mb MiB at img, its root root's.
func (d *diskImages) image(ctx context.Context, img string, mb int) error {
	d.mkfsOnce.Do(func() { d.mkfs, d.mkfsErr = loopdisk.Mkfs() })
	if d.mkfsErr != nil {
		return d.mkfsErr
	}
	format := func(p string) error { return loopdisk.Format(ctx, d.mkfs, p, mb, "") }
	if t := d.tmpls[mb]; t != nil {
		tmpl, err := t.Get(filepath.Join(d.dir, strconv.Itoa(mb)+".img"), format)
		if err != nil {
			return err
		}
		if tmpl != "" {
			return loopdisk.CopySparse(tmpl, img)
		}
	}
	return format(img)
}

// close removes the templates; disks made after it are formatted.
func (d *diskImages) close() {
	for _, t := range d.tmpls {
		t.Close()
	}
	if d.dir == "" {
		return
	}
	_ = os.Remove(d.dir)
	_ = os.Remove(filepath.Dir(d.dir)) // when no other Backend's is left
}

// collectTemplates removes the templates earlier boxrt processes left.
func (b *Backend) collectTemplates() {
	parent := filepath.Dir(b.disks.dir)
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if p := filepath.Join(parent, e.Name()); p != b.disks.dir {
			_ = os.RemoveAll(p)
		}
	}
}
