package skills

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// within reports whether p is dir or below it. Both must be clean absolute
// paths; the separator check keeps "/a/bc" from counting as inside "/a/b".
func within(dir, p string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// resolveHostPath resolves a caller-supplied host path (scan path,
// package_root) to its real path and requires it to stay inside root (a
// real path). Relative paths are taken relative to root: the reference
// resolves them against the runtime's working directory, which a remote
// host cannot know. label names the path in messages.
func resolveHostPath(root, p, label, field string) (string, error) {
	p = strings.TrimSpace(p)
	if p == "" {
		return "", boxerr.Validation(field, "%s is required", label)
	}
	if strings.ContainsRune(p, 0) {
		return "", boxerr.Validation(field, "%s contains a NUL byte: %q", label, p)
	}
	abs := p
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(root, abs)
	}
	real, err := filepath.EvalSymlinks(filepath.Clean(abs))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// Refuse an outside path as outside even when it does not
			// exist, so the message does not probe the host's tree.
			if !within(root, filepath.Clean(abs)) {
				return "", boxerr.Validation(field, "%s must stay within the skill root: %s", label, p)
			}
			return "", boxerr.Validation(field, "Directory does not exist: %s", p).Wrap(err)
		}
		return "", boxerr.Validation(field, "%s cannot be resolved: %s: %v", label, p, err).Wrap(err)
	}
	if !within(root, real) {
		return "", boxerr.Validation(field, "%s must stay within the skill root: %s", label, p)
	}
	return real, nil
}

// cleanRel normalises a skill file path as the reference does: trimmed,
// "" means ".", absolute refused, and after cleaning anything starting with
// ".." refused (which also refuses names like "..foo", as the reference
// does). The result uses "/" and is what responses echo back.
func cleanRel(p, field string) (string, error) {
	p = strings.TrimSpace(p)
	if p == "" {
		p = "."
	}
	if strings.ContainsRune(p, 0) {
		return "", boxerr.Validation(field, "path contains a NUL byte: %q", p)
	}
	if strings.HasPrefix(p, "/") || filepath.IsAbs(p) {
		return "", boxerr.Validation(field, "path must be relative to the skill package root: %s", p)
	}
	c := path.Clean(p)
	if strings.HasPrefix(c, "..") {
		return "", boxerr.Validation(field, "path must stay within the skill package root: %s", p)
	}
	return c, nil
}

// resolveExisting resolves rel (clean) inside the package at pkgDir (a
// real path) with symlinks followed, requires the result inside the
// package, and returns it relative to pkgDir. Missing paths are
// fs.ErrNotExist for the caller to word.
func resolveExisting(pkgDir, rel, field string) (string, error) {
	real, err := filepath.EvalSymlinks(filepath.Join(pkgDir, filepath.FromSlash(rel)))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return "", boxerr.Validation(field, "path cannot be resolved: %s: %v", rel, err).Wrap(err)
	}
	if !within(pkgDir, real) {
		return "", boxerr.Validation(field, "path must stay within the skill package root: %s", rel)
	}
	out, err := filepath.Rel(pkgDir, real)
	if err != nil {
		return "", boxerr.Failure("path %s: %v", rel, err).Wrap(err)
	}
	return out, nil
}

// resolveForWrite is resolveExisting for a file that may not exist yet: an
// existing path (or symlink inside the package) is written through; for a
// new one the deepest existing ancestor is resolved and checked, and the
// missing components are appended. A dangling symlink is refused because
// its target cannot be checked.
func resolveForWrite(pkgDir, rel, field string) (string, error) {
	full := filepath.Join(pkgDir, filepath.FromSlash(rel))
	if out, err := resolveExisting(pkgDir, rel, field); err == nil {
		return out, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if _, err := os.Lstat(full); err == nil {
		return "", boxerr.Validation(field, "path must stay within the skill package root: %s (dangling symlink)", rel)
	}
	missing := []string{filepath.Base(full)}
	dir := filepath.Dir(full)
	for {
		real, err := filepath.EvalSymlinks(dir)
		if err == nil {
			if !within(pkgDir, real) {
				return "", boxerr.Validation(field, "path must stay within the skill package root: %s", rel)
			}
			for i := len(missing) - 1; i >= 0; i-- {
				real = filepath.Join(real, missing[i])
			}
			return filepath.Rel(pkgDir, real)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", boxerr.Validation(field, "path cannot be resolved: %s: %v", rel, err).Wrap(err)
		}
		if _, lerr := os.Lstat(dir); lerr == nil {
			return "", boxerr.Validation(field, "path must stay within the skill package root: %s (dangling symlink)", rel)
		}
		if dir == pkgDir || !within(pkgDir, dir) {
			// pkgDir itself vanished (deleted concurrently).
			return "", boxerr.Validation(field, "Skill package no longer exists: %s", pkgDir).Wrap(err)
		}
		missing = append(missing, filepath.Base(dir))
		dir = filepath.Dir(dir)
	}
}
