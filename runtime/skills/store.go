package skills

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/keyed"
)

// Discovery bounds (reference §9.3).
const (
	ListDepth           = 6
	ScanDepth           = 2
	MaxDiscoveryEntries = 10000
	MaxDiscoveredSkills = 1000
	// MaxListTextBytes caps the text box_list_skills returns in total.
	MaxListTextBytes = 16 << 20
)

// internalPrefix marks the store's own temporary entries (staging and
// trash directories, temp files); discovery and file listings skip them.
const internalPrefix = ".boxrt-"

// stagingPrefix names install staging directories in the root.
const stagingPrefix = internalPrefix + "staging-"

// Limits are the configurable ZIP and upload limits (runtime.Limits).
type Limits struct {
	MaxUploadBytes   int64 // limits.max_rpc_file_bytes
	MaxZipBytes      int64 // limits.max_skill_zip_bytes
	MaxZipEntries    int   // limits.max_skill_zip_entries
	MaxZipEntryBytes int64 // limits.max_skill_zip_entry_bytes
	MaxZipTotalBytes int64 // limits.max_skill_zip_total_bytes
	MaxZipRatio      int64 // limits.max_skill_zip_ratio
}

// DefaultLimits are the reference's values.
func DefaultLimits() Limits {
	return Limits{
		MaxUploadBytes:   20 << 20,
		MaxZipBytes:      20 << 20,
		MaxZipEntries:    512,
		MaxZipEntryBytes: 16 << 20,
		MaxZipTotalBytes: 64 << 20,
		MaxZipRatio:      100,
	}
}

// ResolveRoot applies the reference's root rules: host_root defaults to
// ./data/box, skills_root to "skills", and a relative skills_root lives
// under host_root. The result is absolute (relative to the working
// directory when host_root is relative).
func ResolveRoot(hostRoot, skillsRoot string) string {
	if strings.TrimSpace(hostRoot) == "" {
		hostRoot = "./data/box"
	}
	if strings.TrimSpace(skillsRoot) == "" {
		skillsRoot = "skills"
	}
	hostRoot, skillsRoot = expandHome(hostRoot), expandHome(skillsRoot)
	if !filepath.IsAbs(skillsRoot) {
		skillsRoot = filepath.Join(hostRoot, skillsRoot)
	}
	if abs, err := filepath.Abs(skillsRoot); err == nil {
		return abs
	}
	return filepath.Clean(skillsRoot)
}

func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~"); ok && (rest == "" || rest[0] == '/') {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}

// Store is the skill store. Its methods are safe for concurrent use.
type Store struct {
	rootFn func() string
	locks  keyed.Locks
	// work is shared with the store's Workspace-scoped views (Scoped): a
	// file_key uploaded through __file_chunk, which carries no Workspace,
	// must be installable from any of them.
	*work

	scopeMu sync.Mutex
	scopes  map[string]*Store // Workspace namespace → scoped view; nil in a view
}

// work is what a store and its scoped views share: limits, clock, uploads
// and the private work directory.
type work struct {
	limitsFn   func() Limits
	now        func() time.Time
	tempParent string
	uploadTTL  time.Duration

	uploads uploads

	privMu   sync.Mutex
	priv     string   // private 0700 work dir (uploads, extraction); "" until needed
	privLock *os.File // holds priv's flock: it is in use
	closed   bool
}

// Option configures a Store.
type Option func(*Store)

// WithTempDir sets the parent of the store's private work directory
// (uploads and ZIP extraction); default os.TempDir().
func WithTempDir(dir string) Option { return func(s *Store) { s.tempParent = dir } }

// WithClock replaces time.Now (upload expiry in tests).
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithUploadTTL sets how long an untouched upload is kept (default 10 min).
func WithUploadTTL(d time.Duration) Option { return func(s *Store) { s.uploadTTL = d } }

// New returns a store. root is called on every operation, so a box_init
// that changes local.host_root or local.skills_root takes effect at once;
// limits likewise. A nil limits means DefaultLimits.
func New(root func() string, limits func() Limits, opts ...Option) *Store {
	if limits == nil {
		limits = DefaultLimits
	}
	s := &Store{rootFn: root, scopes: map[string]*Store{},
		work: &work{limitsFn: limits, now: time.Now, tempParent: os.TempDir(), uploadTTL: UploadTTL}}
	for _, o := range opts {
		o(s)
	}
	s.uploads.store = s
	// A boxrt killed with -9 leaves its work directories behind: remove
	// those no live boxrt holds.
	removeLeftovers(s.tempParent, privatePrefix)
	if root := s.rootFn(); strings.TrimSpace(root) != "" {
		removeLeftovers(root, stagingPrefix)
	}
	return s
}

// Close drops pending uploads and removes the private work directory.
// Later upload and ZIP calls fail; the rest keeps working.
func (s *Store) Close() error {
	s.uploads.close()
	s.privMu.Lock()
	defer s.privMu.Unlock()
	s.closed = true
	if s.priv == "" {
		return nil
	}
	err := os.RemoveAll(s.priv)
	s.privLock.Close()
	s.priv, s.privLock = "", nil
	return err
}

// privateDir returns the store's private work directory, creating it 0700
// on first use.
func (s *Store) privateDir() (string, error) {
	s.privMu.Lock()
	defer s.privMu.Unlock()
	if s.closed {
		return "", boxerr.RuntimeUnavailable("skill store is closed")
	}
	if s.priv != "" {
		return s.priv, nil
	}
	if err := os.MkdirAll(s.tempParent, 0o755); err != nil {
		return "", boxerr.Failure("cannot create temp dir %s: %v", s.tempParent, err).Wrap(err)
	}
	dir, err := os.MkdirTemp(s.tempParent, privatePrefix)
	if err != nil {
		return "", boxerr.Failure("cannot create private temp dir: %v", err).Wrap(err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", boxerr.Failure("cannot lock private temp dir: %v", err).Wrap(err)
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	s.priv, s.privLock = dir, lock
	return dir, nil
}

func (s *Store) limits() Limits { return s.limitsFn() }

// Root returns the store root as a real path, creating it if missing.
func (s *Store) Root(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p := s.rootFn()
	if strings.TrimSpace(p) == "" {
		return "", boxerr.Failure("skill store root is not configured")
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return "", boxerr.Failure("cannot create skill root %s: %v", p, err).Wrap(err)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", boxerr.Failure("cannot resolve skill root %s: %v", p, err).Wrap(err)
	}
	return real, nil
}

// List returns every valid skill under the root, newest first.
func (s *Store) List(ctx context.Context) ([]Skill, error) {
	root, err := s.Root(ctx)
	if err != nil {
		return nil, err
	}
	return s.list(ctx, root)
}

func (s *Store) list(ctx context.Context, root string) ([]Skill, error) {
	dirs, err := discover(ctx, root, ListDepth, s.scopesDir(root))
	if err != nil {
		return nil, err
	}
	out := make([]Skill, 0, len(dirs))
	total := 0
	for _, dir := range dirs {
		sk, err := loadSkill(dir)
		if err != nil {
			continue // corrupt or invalid packages are invisible, as in the reference
		}
		total += len(sk.Name) + len(sk.DisplayName) + len(sk.Description) + len(sk.Instructions)
		if total > MaxListTextBytes {
			return nil, boxerr.Failure("Skill listing exceeds the configured text limit (%d bytes)", MaxListTextBytes)
		}
		out = append(out, sk)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].updated.Equal(out[j].updated) {
			return out[i].updated.After(out[j].updated)
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// Get returns the skill called name, or nil.
func (s *Store) Get(ctx context.Context, name string) (*Skill, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return nil, boxerr.Validation("name", "Skill name is required")
	}
	all, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if all[i].Name == name {
			return &all[i], nil
		}
	}
	return nil, nil
}

// find is Get that turns "missing" into a validation error.
func (s *Store) find(ctx context.Context, name string) (Skill, error) {
	name, err := ValidateName(name)
	if err != nil {
		return Skill{}, err
	}
	sk, err := s.Get(ctx, name)
	if err != nil {
		return Skill{}, err
	}
	if sk == nil {
		return Skill{}, boxerr.Validation("name", "Skill %q not found", name)
	}
	return *sk, nil
}

// PackageRoot returns the host directory of the skill called name (a real
// path inside the store root), e.g. to mount it into a session.
func (s *Store) PackageRoot(ctx context.Context, name string) (string, error) {
	sk, err := s.find(ctx, name)
	if err != nil {
		return "", err
	}
	return sk.PackageRoot, nil
}

// discoverable reports whether list discovery would reach the package at
// p (a real path strictly inside root): not too deep, no reserved
// component, and no ancestor that is itself a skill (discovery does not
// descend into skills).
func discoverable(root, p, skip string) bool {
	parts := strings.Split(relToRoot(root, p), "/")
	if len(parts) > ListDepth || (skip != "" && (p == skip || strings.HasPrefix(p, skip+string(filepath.Separator)))) {
		return false
	}
	dir := root
	for _, part := range parts {
		if hasEntry(dir) || strings.HasPrefix(part, internalPrefix) {
			return false
		}
		dir = filepath.Join(dir, part)
	}
	return true
}

// relToRoot returns dir relative to root, "/"-separated.
func relToRoot(root, dir string) string {
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		return dir
	}
	return filepath.ToSlash(rel)
}

// Create adds a skill: a new package <root>/<name>, or, with package_root,
// an existing package inside the root adopted in place (its SKILL.md
// values are the defaults for blank fields).
func (s *Store) Create(ctx context.Context, in Input) (Skill, error) {
	raw := ""
	if in.Name != nil {
		raw = *in.Name
	}
	name, err := ValidateName(raw)
	if err != nil {
		return Skill{}, err
	}
	root, err := s.Root(ctx)
	if err != nil {
		return Skill{}, err
	}
	if dir := s.scopesDir(root); dir != "" && filepath.Join(root, name) == dir {
		return Skill{}, boxerr.Validation("name", "Skill name %q is reserved for the Workspace skill stores", name)
	}
	unlockName := s.locks.Lock(nameKey(name))
	defer unlockName()
	if existing, err := s.Get(ctx, name); err != nil {
		return Skill{}, err
	} else if existing != nil {
		return Skill{}, boxerr.Validation("name", "Skill with name %q already exists", name)
	}

	adopt := in.PackageRoot != nil && strings.TrimSpace(*in.PackageRoot) != ""
	pkgDir := filepath.Join(root, name)
	if adopt {
		if pkgDir, err = s.adoptable(root, name, *in.PackageRoot); err != nil {
			return Skill{}, err
		}
	}
	unlockPkg := s.locks.Lock(pkgKey(relToRoot(root, pkgDir)))
	defer unlockPkg()

	entry := EntryFile
	var defaults map[string]string
	var defaultInstructions string
	created := false
	if adopt {
		entry, defaults, defaultInstructions, err = readAdopted(pkgDir)
	} else {
		created, err = makePackageDir(ctx, root, name, pkgDir)
	}
	if err != nil {
		return Skill{}, err
	}

	text, err := entryText(name, in, defaults, defaultInstructions)
	if err == nil {
		err = s.writeEntry(pkgDir, entry, text)
	}
	if err == nil {
		var sk Skill
		if sk, err = loadSkill(pkgDir); err == nil {
			return sk, nil
		}
		err = boxerr.Failure("Failed to create skill: %v", err).Wrap(err)
	}
	if created {
		_ = os.RemoveAll(pkgDir)
	}
	return Skill{}, err
}

// adoptable resolves package_root to a package Create may adopt as skill
// name: a directory under the root, with an entry file, that listing
// would find and that is not already another skill.
func (s *Store) adoptable(root, name, packageRoot string) (string, error) {
	p, err := resolveHostPath(root, packageRoot, "package_root", "package_root")
	if err != nil {
		return "", err
	}
	if p == root {
		return "", boxerr.Validation("package_root", "package_root must be a directory under the skill root, not the root itself")
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		return "", boxerr.Validation("package_root", "Directory does not exist: %s", packageRoot)
	}
	if !hasEntry(p) {
		return "", boxerr.Validation("package_root", "No SKILL.md found in %s", p)
	}
	if !discoverable(root, p, s.scopesDir(root)) {
		return "", boxerr.Validation("package_root", "package_root %s would not be listed: it is inside another skill, in a reserved directory, or deeper than %d levels", p, ListDepth)
	}
	// Adopting a package that already is a listed skill under another
	// name would be a rename in disguise.
	if cur, err := loadSkill(p); err == nil && cur.Name != name {
		return "", boxerr.Validation("package_root", "%s already holds skill %q; renaming skills is not supported", p, cur.Name)
	}
	return p, nil
}

// readAdopted reads an adopted package's entry file: its name and the
// values it gives, the defaults for blank fields.
func readAdopted(pkgDir string) (entry string, defaults map[string]string, instructions string, err error) {
	pkg, err := os.OpenRoot(pkgDir)
	if err != nil {
		return "", nil, "", boxerr.Validation("package_root", "Directory does not exist: %s", pkgDir).Wrap(err)
	}
	defer pkg.Close()
	entry = findEntry(pkg)
	if entry == "" {
		return "", nil, "", boxerr.Validation("package_root", "No SKILL.md found in %s", pkgDir)
	}
	text, err := readText(pkg, entry, filepath.Join(pkgDir, entry), "package_root")
	if err != nil {
		return "", nil, "", err
	}
	defaults, instructions = ParseSkillMD(text)
	return entry, defaults, instructions, nil
}

// makePackageDir makes <root>/<name> for a new skill, or accepts an
// existing directory there that holds no skill; created says it made it.
func makePackageDir(ctx context.Context, root, name, pkgDir string) (created bool, err error) {
	if hasEntry(pkgDir) {
		return false, boxerr.Validation("name", "Skill directory already exists: %s", pkgDir)
	}
	// A SKILL.md written above nested packages would hide them all
	// (discovery does not descend into a skill).
	if nested, err := discover(ctx, pkgDir, ListDepth, ""); err == nil && len(nested) > 0 {
		return false, boxerr.Validation("name", "Skill directory already exists and holds other skills: %s", pkgDir)
	}
	rootFS, err := os.OpenRoot(root)
	if err != nil {
		return false, boxerr.Failure("open skill root: %v", err).Wrap(err)
	}
	defer rootFS.Close()
	err = rootFS.Mkdir(name, 0o755)
	created = err == nil
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return false, boxerr.Failure("create %s: %v", pkgDir, err).Wrap(err)
	}
	// A pre-existing <root>/<name> must be a real directory: writing
	// through a planted symlink would leave the root.
	if fi, err := rootFS.Lstat(name); err != nil || !fi.IsDir() {
		return created, boxerr.Validation("name", "Skill directory %s exists and is not a directory", pkgDir)
	}
	return created, nil
}

// entryText is a new skill's entry file. A given value wins unless it is
// blank while the adopted package has one (the reference's rule), so a
// form with empty fields does not wipe an imported description.
func entryText(name string, in Input, defaults map[string]string, defaultInstructions string) (string, error) {
	pick := func(given *string, imported string) string {
		if given != nil && (strings.TrimSpace(*given) != "" || imported == "") {
			return *given
		}
		return imported
	}
	display := strings.TrimSpace(pick(in.DisplayName, defaults["display_name"]))
	desc := strings.TrimSpace(pick(in.Description, defaults["description"]))
	return FormatSkillMD(name, display, desc, pick(in.Instructions, defaultInstructions))
}

// writeEntry checks the size limit and writes an entry file atomically.
func (s *Store) writeEntry(pkgDir, entry, text string) error {
	if len(text) > MaxTextBytes {
		return boxerr.Validation("instructions", "%s would exceed the %d-byte limit", entry, MaxTextBytes)
	}
	pkg, err := os.OpenRoot(pkgDir)
	if err != nil {
		return boxerr.Validation("package_root", "Skill package no longer exists: %s", pkgDir).Wrap(err)
	}
	defer pkg.Close()
	return writeAtomic(pkg, entry, []byte(text), 0o644)
}

// Update rewrites a skill's display name, description and instructions;
// fields not given keep their values. Renaming and moving are refused.
func (s *Store) Update(ctx context.Context, name string, in Input) (Skill, error) {
	name, err := ValidateName(name)
	if err != nil {
		return Skill{}, err
	}
	root, err := s.Root(ctx)
	if err != nil {
		return Skill{}, err
	}
	unlockName := s.locks.Lock(nameKey(name))
	defer unlockName()
	sk, err := s.find(ctx, name)
	if err != nil {
		return Skill{}, err
	}
	if in.Name != nil && strings.TrimSpace(*in.Name) != "" && strings.TrimSpace(*in.Name) != name {
		return Skill{}, boxerr.Validation("skill.name", "Renaming skills is not supported")
	}
	if in.PackageRoot != nil && strings.TrimSpace(*in.PackageRoot) != "" {
		if p, err := resolveHostPath(root, *in.PackageRoot, "package_root", "package_root"); err != nil || p != sk.PackageRoot {
			return Skill{}, boxerr.Validation("skill.package_root", "Updating package_root is not supported; recreate the skill to import a different package")
		}
	}
	unlockPkg := s.locks.Lock(pkgKey(relToRoot(root, sk.PackageRoot)))
	defer unlockPkg()
	// Re-read under the package lock: a file write may have changed it.
	cur, err := loadSkill(sk.PackageRoot)
	if err != nil || cur.Name != name {
		return Skill{}, boxerr.Validation("name", "Skill %q not found", name)
	}
	val := func(given *string, old string) string {
		if given != nil {
			return *given
		}
		return old
	}
	text, err := FormatSkillMD(name,
		strings.TrimSpace(val(in.DisplayName, cur.DisplayName)),
		strings.TrimSpace(val(in.Description, cur.Description)),
		val(in.Instructions, cur.Instructions))
	if err != nil {
		return Skill{}, err
	}
	if err := s.writeEntry(cur.PackageRoot, cur.EntryFile, text); err != nil {
		return Skill{}, err
	}
	out, err := loadSkill(cur.PackageRoot)
	if err != nil {
		return Skill{}, boxerr.Failure("skill %q unreadable after update: %v", name, err).Wrap(err)
	}
	return out, nil
}

// Delete removes a skill's package directory. Only packages strictly
// inside the root can be deleted. Unlike the reference, which removes the
// whole top-level directory containing the package (taking sibling skills
// of a multi-skill repository with it), only the package itself goes,
// then any parents it leaves empty.
func (s *Store) Delete(ctx context.Context, name string) error {
	name, err := ValidateName(name)
	if err != nil {
		return err
	}
	root, err := s.Root(ctx)
	if err != nil {
		return err
	}
	unlockName := s.locks.Lock(nameKey(name))
	defer unlockName()
	sk, err := s.find(ctx, name)
	if err != nil {
		return err
	}
	rel := relToRoot(root, sk.PackageRoot)
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || !within(root, sk.PackageRoot) {
		return boxerr.Validation("name", "Only managed skills under the Box skills root can be deleted")
	}
	unlockPkg := s.locks.Lock(pkgKey(rel))
	defer unlockPkg()
	rootFS, err := os.OpenRoot(root)
	if err != nil {
		return boxerr.Failure("open skill root: %v", err).Wrap(err)
	}
	defer rootFS.Close()
	// Move it out of sight first so a concurrent listing sees the skill
	// either whole or gone, never half-deleted.
	trash := internalPrefix + "trash-" + randHex(8)
	if err := rootFS.Rename(rel, trash); err != nil {
		return boxerr.Failure("delete skill %q: %v", name, err).Wrap(err)
	}
	if err := rootFS.RemoveAll(trash); err != nil {
		return boxerr.Failure("skill %q removed from the store but its files could not all be deleted: %v", name, err).Wrap(err)
	}
	for d := path.Dir(rel); d != "." && d != "/"; d = path.Dir(d) {
		if rootFS.Remove(d) != nil {
			break // not empty (or gone): stop pruning
		}
	}
	return nil
}

// Scan finds the single skill in dir (inside the root) or its
// subdirectories up to depth 2, without registering anything.
func (s *Store) Scan(ctx context.Context, dir string) (Skill, error) {
	root, err := s.Root(ctx)
	if err != nil {
		return Skill{}, err
	}
	p, err := resolveHostPath(root, dir, "scan path", "path")
	if err != nil {
		return Skill{}, err
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		return Skill{}, boxerr.Validation("path", "Directory does not exist: %s", dir)
	}
	dirs, err := discover(ctx, p, ScanDepth, "")
	if err != nil {
		return Skill{}, err
	}
	switch len(dirs) {
	case 0:
		return Skill{}, boxerr.Validation("path", "No SKILL.md found in %s or its subdirectories (max depth: %d)", p, ScanDepth)
	case 1:
	default:
		sort.Strings(dirs)
		return Skill{}, boxerr.Validation("path", "Multiple skill directories found in %s. Please choose a more specific path: %s", p, strings.Join(dirs, ", "))
	}
	return loadSkill(dirs[0])
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
