package skills

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"unicode"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// ZipSource is where an archive comes from: exactly one of an upload key
// (staged by __file_chunk, consumed by the call), inline base64, or bytes.
type ZipSource struct {
	FileKey string
	Base64  string
	Data    []byte
}

// ZipOptions are the preview/install parameters. TargetSuffix is used as
// given (the action applies the default "upload").
type ZipOptions struct {
	Filename     string
	SourceSubdir string
	TargetSuffix string
	// Install only: which discovered skills to install (source paths,
	// "" or "." for the archive root); SourcePath is the legacy single form.
	SourcePaths []string
	SourcePath  string
}

// candidate is one skill found in an extracted archive.
type candidate struct {
	dir    string // extracted package directory
	target string // install directory name under the store root
	skill  PreviewSkill
}

// staged is an extracted archive; remove() deletes it.
type staged struct {
	work  string
	cands []candidate
}

func (st *staged) remove() { _ = os.RemoveAll(st.work) }

// open returns the archive bytes as a ReaderAt. An upload is consumed:
// its file is unlinked before this returns.
func (s *Store) openZip(src ZipSource, lim Limits) (io.ReaderAt, int64, func(), error) {
	n := 0
	for _, set := range []bool{src.FileKey != "", src.Base64 != "", src.Data != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, 0, nil, boxerr.Validation("file_key", "exactly one of file_key and zip_base64 is required")
	}
	switch {
	case src.FileKey != "":
		f, size, err := s.uploads.take(src.FileKey)
		if err != nil {
			return nil, 0, nil, err
		}
		return f, size, func() { f.Close() }, nil
	case src.Base64 != "":
		// Refuse by encoded length before decoding anything.
		if int64(len(src.Base64)) > int64(base64.StdEncoding.EncodedLen(int(lim.MaxZipBytes))) {
			return nil, 0, nil, boxerr.Validation("zip_base64", "Uploaded archive exceeds the compressed size limit (%d bytes)", lim.MaxZipBytes)
		}
		data, err := base64.StdEncoding.Strict().DecodeString(src.Base64)
		if err != nil {
			return nil, 0, nil, boxerr.Validation("zip_base64", "zip_base64 is not valid base64: %v", err).Wrap(err)
		}
		return bytes.NewReader(data), int64(len(data)), func() {}, nil
	default:
		return bytes.NewReader(src.Data), int64(len(src.Data)), func() {}, nil
	}
}

// stage extracts the archive into a private directory and finds its skills.
func (s *Store) stage(ctx context.Context, root string, src ZipSource, opts ZipOptions) (*staged, error) {
	lim := s.limits()
	ra, size, done, err := s.openZip(src, lim)
	if err != nil {
		return nil, err
	}
	defer done()
	priv, err := s.privateDir()
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(priv, "extract-")
	if err != nil {
		return nil, boxerr.Failure("create extraction dir: %v", err).Wrap(err)
	}
	st := &staged{work: work}
	ok := false
	defer func() {
		if !ok {
			st.remove()
		}
	}()
	if err := extractArchive(ctx, ra, size, lim, work); err != nil {
		return nil, err
	}
	archiveRoot := work
	// One top-level directory and nothing else: that directory is the
	// archive root (the usual "repo-main/…" layout).
	if des, err := os.ReadDir(work); err == nil && len(des) == 1 && des[0].IsDir() {
		archiveRoot = filepath.Join(work, des[0].Name())
	}
	base, err := sourceSubdir(archiveRoot, opts.SourceSubdir)
	if err != nil {
		return nil, err
	}
	dirs, err := discover(ctx, base, ScanDepth, "")
	if err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		return nil, zipError("No SKILL.md found in the uploaded archive (max depth: %d)", ScanDepth)
	}
	stem := archiveStem(opts.Filename)
	suffix := sanitizeName(opts.TargetSuffix)
	for _, dir := range dirs {
		sp := filepath.ToSlash(relToRoot(archiveRoot, dir))
		if sp == "." {
			sp = ""
		}
		sk, err := loadSkill(dir)
		if err != nil {
			var be *boxerr.Error
			msg := err.Error()
			if errors.As(err, &be) {
				msg = be.Msg
			}
			return nil, zipError("Skill at %s in the uploaded archive is invalid: %s", describe(sp), msg).Wrap(err)
		}
		target := stem
		if leaf := sanitizeName(path.Base(sp)); sp != "" && leaf != "" && leaf != stem {
			target += "-" + leaf
		}
		if suffix != "" {
			target += "-" + suffix
		}
		sk.PackageRoot = filepath.Join(root, target)
		st.cands = append(st.cands, candidate{dir: dir, target: target, skill: PreviewSkill{Skill: sk, SourcePath: sp}})
	}
	sort.Slice(st.cands, func(i, j int) bool { return st.cands[i].skill.SourcePath < st.cands[j].skill.SourcePath })
	ok = true
	return st, nil
}

// sourceSubdir narrows the archive to a subdirectory (reference rules).
func sourceSubdir(archiveRoot, sub string) (string, error) {
	sub = strings.Trim(strings.ReplaceAll(strings.TrimSpace(sub), `\`, "/"), "/")
	if sub == "" {
		return archiveRoot, nil
	}
	if strings.ContainsRune(sub, 0) {
		return "", boxerr.Validation("source_subdir", "source_subdir contains a NUL byte")
	}
	c := path.Clean(sub)
	if strings.HasPrefix(c, "..") || path.IsAbs(c) {
		return "", boxerr.Validation("source_subdir", "source_subdir must stay within the uploaded archive")
	}
	real, err := filepath.EvalSymlinks(filepath.Join(archiveRoot, filepath.FromSlash(c)))
	if err != nil {
		return "", boxerr.Validation("source_subdir", "source_subdir does not exist in the uploaded archive: %s", sub)
	}
	if !within(archiveRoot, real) {
		return "", boxerr.Validation("source_subdir", "source_subdir must stay within the uploaded archive")
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return "", boxerr.Validation("source_subdir", "source_subdir does not exist in the uploaded archive: %s", sub)
	}
	return real, nil
}

// sanitizeName keeps letters, digits, '-' and '_' (anything else becomes
// '-') and trims '-'/'_' at both ends, so the result is always a safe
// single path component or "".
func sanitizeName(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsLetter(r) || unicode.IsNumber(r) || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, s)
	return strings.Trim(s, "-_")
}

// archiveStem is the sanitised file name without its extension, or
// "uploaded-skill".
func archiveStem(filename string) string {
	base := path.Base(strings.ReplaceAll(strings.TrimSpace(filename), `\`, "/"))
	if ext := path.Ext(base); ext != base {
		base = strings.TrimSuffix(base, ext)
	}
	if s := sanitizeName(base); s != "" {
		return s
	}
	return "uploaded-skill"
}

// PreviewZip extracts an archive privately and returns the skills it would
// install, with PackageRoot set to the proposed install directory. Nothing
// is written to the store.
func (s *Store) PreviewZip(ctx context.Context, src ZipSource, opts ZipOptions) ([]PreviewSkill, error) {
	root, err := s.Root(ctx)
	if err != nil {
		return nil, err
	}
	st, err := s.stage(ctx, root, src, opts)
	if err != nil {
		return nil, err
	}
	defer st.remove()
	out := make([]PreviewSkill, len(st.cands))
	for i, c := range st.cands {
		out[i] = c.skill
	}
	return out, nil
}

// normalizeSourcePath is the reference's selection normalisation; "." and
// "" both mean the archive root.
func normalizeSourcePath(p string) string {
	p = strings.Trim(strings.ReplaceAll(strings.TrimSpace(p), `\`, "/"), "/")
	if p == "." {
		return ""
	}
	return p
}

// InstallZip installs the selected skills of an archive. It is
// all-or-nothing: every selected package is first copied into a staging
// directory inside the root (invisible to discovery) and verified; only
// then is each renamed into place, and any failure removes what this call
// created. A skill whose name is already taken is refused (the reference
// would install a second package with the same name, unreachable by name).
func (s *Store) InstallZip(ctx context.Context, src ZipSource, opts ZipOptions) ([]Skill, error) {
	root, err := s.Root(ctx)
	if err != nil {
		return nil, err
	}
	st, err := s.stage(ctx, root, src, opts)
	if err != nil {
		return nil, err
	}
	defer st.remove()

	selected, err := selectCandidates(st.cands, opts)
	if err != nil {
		return nil, err
	}
	keys, names, err := distinctTargets(root, selected)
	if err != nil {
		return nil, err
	}
	unlock := s.locks.Lock(keys...)
	defer unlock()
	if err := s.checkFree(ctx, root, selected, names); err != nil {
		return nil, err
	}

	staging, err := os.MkdirTemp(root, stagingPrefix)
	if err != nil {
		return nil, boxerr.Failure("create staging dir: %v", err).Wrap(err)
	}
	defer os.RemoveAll(staging)
	stagingLock, err := lockDir(staging)
	if err != nil {
		return nil, boxerr.Failure("lock staging dir: %v", err).Wrap(err)
	}
	defer stagingLock.Close()
	if err := stageCopies(ctx, staging, selected); err != nil {
		return nil, err
	}
	return placeStaged(root, staging, selected)
}

// selectCandidates picks the archive's skills to install: those named by
// source_paths (and the legacy source_path), or the only one there is.
func selectCandidates(cands []candidate, opts ZipOptions) ([]candidate, error) {
	var requested []string
	seen := map[string]bool{}
	add := func(p string) {
		p = normalizeSourcePath(p)
		if !seen[p] {
			seen[p] = true
			requested = append(requested, p)
		}
	}
	for _, p := range opts.SourcePaths {
		add(p)
	}
	if strings.TrimSpace(opts.SourcePath) != "" {
		add(opts.SourcePath)
	}
	available := make([]string, len(cands))
	bySource := map[string]candidate{}
	for i, c := range cands {
		available[i] = describe(c.skill.SourcePath)
		bySource[c.skill.SourcePath] = c
	}
	switch {
	case len(requested) == 0 && len(cands) == 1:
		return cands, nil
	case len(requested) == 0:
		return nil, boxerr.Validation("source_paths", "Multiple skills found. Please choose one or more source_paths: %s", strings.Join(available, ", "))
	}
	var selected []candidate
	for _, p := range requested {
		c, ok := bySource[p]
		if !ok {
			return nil, boxerr.Validation("source_paths", "Invalid source_path %q. Available: %s", describe(p), strings.Join(available, ", "))
		}
		selected = append(selected, c)
	}
	return selected, nil
}

// distinctTargets refuses a selection whose skills share a directory or a
// name, and returns the lock keys of the selection and its names.
func distinctTargets(root string, selected []candidate) (keys []string, names map[string]bool, err error) {
	targets := map[string]bool{}
	names = map[string]bool{}
	for _, c := range selected {
		if targets[c.target] {
			return nil, nil, boxerr.Validation("source_paths", "Two selected skills would install to the same directory: %s", filepath.Join(root, c.target))
		}
		if names[c.skill.Name] {
			return nil, nil, boxerr.Validation("source_paths", "Two selected skills have the same name: %q", c.skill.Name)
		}
		targets[c.target], names[c.skill.Name] = true, true
		keys = append(keys, nameKey(c.skill.Name), pkgKey(c.target))
	}
	return keys, names, nil
}

// checkFree refuses names the store already has and target directories
// that exist; the caller holds the selection's locks.
func (s *Store) checkFree(ctx context.Context, root string, selected []candidate, names map[string]bool) error {
	existing, err := s.list(ctx, root)
	if err != nil {
		return err
	}
	for _, sk := range existing {
		if names[sk.Name] {
			return boxerr.Validation("source_paths", "Skill with name %q already exists", sk.Name)
		}
	}
	for _, c := range selected {
		if _, err := os.Lstat(filepath.Join(root, c.target)); err == nil {
			return boxerr.Validation("source_paths", "Skill directory already exists: %s", filepath.Join(root, c.target))
		}
	}
	return nil
}

// stageCopies copies each selected package into staging and checks that
// the copy holds exactly that one, loadable, skill.
func stageCopies(ctx context.Context, staging string, selected []candidate) error {
	for _, c := range selected {
		dst := filepath.Join(staging, c.target)
		if err := copyTree(ctx, c.dir, dst); err != nil {
			return err
		}
		if dirs, err := discover(ctx, dst, ScanDepth, ""); err != nil {
			return err
		} else if len(dirs) != 1 {
			return zipError("Skill at %s does not hold exactly one skill", describe(c.skill.SourcePath))
		}
		if _, err := loadSkill(dst); err != nil {
			return zipError("Skill at %s cannot be installed: %v", describe(c.skill.SourcePath), err).Wrap(err)
		}
	}
	return nil
}

// placeStaged moves the staged packages into the root and loads them;
// on any failure it removes every package it placed.
func placeStaged(root, staging string, selected []candidate) ([]Skill, error) {
	// Claim each target with an exclusive mkdir, then rename the staged
	// package over the empty claim (rename replaces an empty directory
	// atomically). A directory that appeared meanwhile fails the claim.
	var placed []string
	rollback := func() {
		for _, p := range placed {
			_ = os.RemoveAll(p)
		}
	}
	for _, c := range selected {
		dst := filepath.Join(root, c.target)
		if err := os.Mkdir(dst, 0o755); err != nil {
			rollback()
			if errors.Is(err, fs.ErrExist) {
				return nil, boxerr.Validation("source_paths", "Skill directory already exists: %s", dst)
			}
			return nil, boxerr.Failure("install %s: %v", dst, err).Wrap(err)
		}
		placed = append(placed, dst)
		// syscall.Rename, not os.Rename: os.Rename refuses any existing
		// directory as the destination, even the empty one we just made.
		if err := syscall.Rename(filepath.Join(staging, c.target), dst); err != nil {
			rollback()
			return nil, boxerr.Failure("install %s: %v", dst, err).Wrap(err)
		}
	}
	out := make([]Skill, 0, len(selected))
	for _, c := range selected {
		sk, err := loadSkill(filepath.Join(root, c.target))
		if err != nil {
			rollback()
			return nil, boxerr.Failure("installed skill %s is unreadable: %v", c.target, err).Wrap(err)
		}
		out = append(out, sk)
	}
	return out, nil
}

// copyTree copies an extracted package (regular files and directories
// only: extraction creates nothing else) keeping the execute bits.
func copyTree(ctx context.Context, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return boxerr.Failure("copy %s: %v", p, err).Wrap(err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return boxerr.Failure("copy %s: %v", p, err).Wrap(err)
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, 0o755); err != nil {
				return boxerr.Failure("copy %s: %v", rel, err).Wrap(err)
			}
			return nil
		case d.Type().IsRegular():
			return copyFile(p, target)
		default:
			return zipError("Archive holds an unexpected file type: %s", rel)
		}
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return boxerr.Failure("copy %s: %v", src, err).Wrap(err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return boxerr.Failure("copy %s: %v", src, err).Wrap(err)
	}
	mode := fs.FileMode(0o644)
	if fi.Mode().Perm()&0o111 != 0 {
		mode = 0o755
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return boxerr.Failure("copy %s: %v", dst, err).Wrap(err)
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Chmod(mode)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return boxerr.Failure("copy %s: %v", dst, err).Wrap(err)
	}
	return nil
}
