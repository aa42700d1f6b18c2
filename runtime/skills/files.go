package skills

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// File listing bounds (reference §9.5).
const (
	DefaultListEntries = 200
	MaxListEntries     = 1000
	MaxDirEntries      = 10000
)

// SkillRef names the skill a file result belongs to.
type SkillRef struct {
	Name string `json:"name"`
}

// FileEntry is one box_list_skill_files entry. Size is nil for directories;
// a symlink reports its target.
type FileEntry struct {
	Path  string `json:"path"`
	Name  string `json:"name"`
	IsDir bool   `json:"is_dir"`
	Size  *int64 `json:"size"`
}

// FileListing is the box_list_skill_files result.
type FileListing struct {
	Skill     SkillRef    `json:"skill"`
	BasePath  string      `json:"base_path"`
	Entries   []FileEntry `json:"entries"`
	Truncated bool        `json:"truncated"`
}

// FileContent is the box_read_skill_file result.
type FileContent struct {
	Skill   SkillRef `json:"skill"`
	Path    string   `json:"path"`
	Content string   `json:"content"`
}

// WriteResult is the box_write_skill_file result.
type WriteResult struct {
	Skill        SkillRef `json:"skill"`
	Path         string   `json:"path"`
	BytesWritten int      `json:"bytes_written"`
}

// ListFilesOptions select what ListFiles returns; zero MaxEntries is not
// defaulted here (the action applies the default 200).
type ListFilesOptions struct {
	Path          string
	IncludeHidden bool
	MaxEntries    int
}

// ListFiles lists one directory of a skill package, sorted by name.
func (s *Store) ListFiles(ctx context.Context, name string, opts ListFilesOptions) (FileListing, error) {
	if opts.MaxEntries < 1 {
		return FileListing{}, boxerr.Validation("max_entries", "max_entries must be a positive integer, got %d", opts.MaxEntries)
	}
	limit := min(opts.MaxEntries, MaxListEntries)
	rel, err := cleanRel(opts.Path, "path")
	if err != nil {
		return FileListing{}, err
	}
	sk, unlock, err := s.openSkill(ctx, name, false)
	if err != nil {
		return FileListing{}, err
	}
	defer unlock()
	real, err := resolveExisting(sk.PackageRoot, rel, "path")
	if errors.Is(err, fs.ErrNotExist) {
		return FileListing{}, boxerr.Validation("path", "Skill directory not found: %s", rel)
	} else if err != nil {
		return FileListing{}, err
	}
	pkg, err := os.OpenRoot(sk.PackageRoot)
	if err != nil {
		return FileListing{}, boxerr.Validation("name", "Skill %q not found", sk.Name).Wrap(err)
	}
	defer pkg.Close()
	f, err := pkg.OpenFile(real, os.O_RDONLY|syscall.O_NONBLOCK, 0) // never block on a planted FIFO
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return FileListing{}, boxerr.Validation("path", "Skill directory not found: %s", rel)
		}
		return FileListing{}, pathError(err, "path", rel)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.IsDir() {
		return FileListing{}, boxerr.Validation("path", "Skill directory not found: %s", rel)
	}
	des, err := f.ReadDir(MaxDirEntries + 1)
	if err != nil && err != io.EOF {
		return FileListing{}, boxerr.Failure("read %s: %v", rel, err).Wrap(err)
	}
	if len(des) > MaxDirEntries {
		return FileListing{}, boxerr.Validation("path", "Skill directory %s has more than %d entries", rel, MaxDirEntries)
	}
	sort.Slice(des, func(i, j int) bool { return des[i].Name() < des[j].Name() })
	out := FileListing{Skill: SkillRef{sk.Name}, BasePath: rel, Entries: []FileEntry{}}
	visible := 0
	for _, de := range des {
		n := de.Name()
		if strings.HasPrefix(n, internalPrefix) || (!opts.IncludeHidden && strings.HasPrefix(n, ".")) {
			continue
		}
		visible++
		if len(out.Entries) >= limit {
			continue
		}
		e := FileEntry{Name: n, Path: n}
		if rel != "." {
			e.Path = rel + "/" + n
		}
		// Stat through the Root follows symlinks that stay inside the
		// package; one leading out reports what the link itself is.
		fi, err := pkg.Stat(path.Join(real, n))
		if err != nil {
			fi, err = de.Info()
		}
		if err == nil {
			e.IsDir = fi.IsDir()
			if !e.IsDir {
				size := fi.Size()
				e.Size = &size
			}
		}
		out.Entries = append(out.Entries, e)
	}
	out.Truncated = visible > limit
	return out, nil
}

// ReadFile returns a skill file's text (at most 1 MiB of UTF-8).
func (s *Store) ReadFile(ctx context.Context, name, p string) (FileContent, error) {
	rel, err := cleanRel(p, "path")
	if err != nil {
		return FileContent{}, err
	}
	sk, unlock, err := s.openSkill(ctx, name, false)
	if err != nil {
		return FileContent{}, err
	}
	defer unlock()
	real, err := resolveExisting(sk.PackageRoot, rel, "path")
	if errors.Is(err, fs.ErrNotExist) {
		return FileContent{}, boxerr.Validation("path", "Skill file not found: %s", rel)
	} else if err != nil {
		return FileContent{}, err
	}
	pkg, err := os.OpenRoot(sk.PackageRoot)
	if err != nil {
		return FileContent{}, boxerr.Validation("name", "Skill %q not found", sk.Name).Wrap(err)
	}
	defer pkg.Close()
	text, err := readText(pkg, real, rel, "path")
	if err != nil {
		return FileContent{}, err
	}
	return FileContent{Skill: SkillRef{sk.Name}, Path: rel, Content: text}, nil
}

// WriteFile creates or replaces a skill file (parents created). The new
// content goes to a temporary file that is renamed over the target, so a
// reader sees the old or the new file, never a mix.
func (s *Store) WriteFile(ctx context.Context, name, p, content string) (WriteResult, error) {
	if len(content) > MaxTextBytes {
		return WriteResult{}, boxerr.Validation("content", "Skill file content exceeds the %d-byte limit", MaxTextBytes)
	}
	if !utf8.ValidString(content) {
		return WriteResult{}, boxerr.Validation("content", "Skill file content is not valid UTF-8 text")
	}
	rel, err := cleanRel(p, "path")
	if err != nil {
		return WriteResult{}, err
	}
	if rel == "." {
		return WriteResult{}, boxerr.Validation("path", "path must name a file inside the skill package")
	}
	if strings.HasPrefix(path.Base(rel), internalPrefix) {
		return WriteResult{}, boxerr.Validation("path", "file names starting with %q are reserved: %s", internalPrefix, rel)
	}
	sk, unlock, err := s.openSkill(ctx, name, true)
	if err != nil {
		return WriteResult{}, err
	}
	defer unlock()
	target, err := resolveForWrite(sk.PackageRoot, rel, "path")
	if err != nil {
		return WriteResult{}, err
	}
	pkg, err := os.OpenRoot(sk.PackageRoot)
	if err != nil {
		return WriteResult{}, boxerr.Validation("name", "Skill %q not found", sk.Name).Wrap(err)
	}
	defer pkg.Close()
	if dir := path.Dir(target); dir != "." {
		if err := pkg.MkdirAll(dir, 0o755); err != nil {
			if isEscape(err) {
				return WriteResult{}, boxerr.Validation("path", "path must stay within the skill package root: %s", rel).Wrap(err)
			}
			return WriteResult{}, boxerr.Validation("path", "cannot create the parent directory of %s: %v", rel, err).Wrap(err)
		}
	}
	perm := fs.FileMode(0o644)
	if fi, err := pkg.Stat(target); err == nil {
		if !fi.Mode().IsRegular() {
			return WriteResult{}, boxerr.Validation("path", "%s is not a regular file", rel)
		}
		perm = fi.Mode().Perm() // keep e.g. the execute bit of a script
	} else if isEscape(err) {
		return WriteResult{}, boxerr.Validation("path", "path must stay within the skill package root: %s", rel).Wrap(err)
	}
	if err := writeAtomic(pkg, target, []byte(content), perm); err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Skill: SkillRef{sk.Name}, Path: rel, BytesWritten: len(content)}, nil
}

// openSkill finds a skill and locks its package (shared for readers,
// exclusive for writers). The caller must call unlock.
func (s *Store) openSkill(ctx context.Context, name string, write bool) (Skill, func(), error) {
	root, err := s.Root(ctx)
	if err != nil {
		return Skill{}, nil, err
	}
	sk, err := s.find(ctx, name)
	if err != nil {
		return Skill{}, nil, err
	}
	key := pkgKey(relToRoot(root, sk.PackageRoot))
	if write {
		return sk, s.locks.Lock(key), nil
	}
	return sk, s.locks.RLock(key), nil
}

// writeAtomic writes data to rel inside root through a temporary sibling
// and a rename. The temp name starts with internalPrefix so listings skip
// it while it exists.
func writeAtomic(root *os.Root, rel string, data []byte, perm fs.FileMode) error {
	tmp := path.Join(path.Dir(rel), internalPrefix+"tmp-"+randHex(8))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		if isEscape(err) {
			return boxerr.Validation("path", "path must stay within the skill package root: %s", rel).Wrap(err)
		}
		return boxerr.Failure("write %s: %v", rel, err).Wrap(err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm) // exact mode, whatever the umask
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, rel)
	}
	if err != nil {
		_ = root.Remove(tmp)
		if isEscape(err) {
			return boxerr.Validation("path", "path must stay within the skill package root: %s", rel).Wrap(err)
		}
		return boxerr.Failure("write %s: %v", rel, err).Wrap(err)
	}
	return nil
}
