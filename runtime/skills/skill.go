package skills

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Entry file names, in order of preference.
const (
	EntryFile      = "SKILL.md"
	EntryFileLower = "skill.md"
)

// MaxNameLen is the longest skill name, in characters.
const MaxNameLen = 64

// MaxTextBytes caps entry files and skill files read or written through the
// API (reference: 1 MiB of UTF-8).
const MaxTextBytes = 1 << 20

// Skill is the public skill object, as box_list_skills returns it.
type Skill struct {
	Name          string `json:"name"`
	DisplayName   string `json:"display_name"`
	Description   string `json:"description"`
	Instructions  string `json:"instructions"`
	PackageRoot   string `json:"package_root"`
	EntryFile     string `json:"entry_file"`
	PythonProject bool   `json:"python_project"`
	CreatedAt     string `json:"created_at"`
	UpdatedAt     string `json:"updated_at"`

	updated time.Time // for sorting; the string form loses nothing but is awkward to compare
}

// PreviewSkill is a skill found in an uploaded archive: PackageRoot is the
// directory it would be installed to, SourcePath its directory relative to
// the archive root ("" for the root itself).
type PreviewSkill struct {
	Skill
	SourcePath string `json:"source_path"`
}

// Input is the writable part of a skill (box_create_skill, box_update_skill).
// A nil field is "not given", which is different from "".
type Input struct {
	Name         *string
	DisplayName  *string
	Description  *string
	Instructions *string
	PackageRoot  *string
}

// ValidateName applies the reference name rule and returns the trimmed
// name: required, at most 64 characters, letters (any script), digits,
// '-' and '_' only. Because '/', '.' and NUL are excluded a valid name is
// always a safe single path component.
func ValidateName(name string) (string, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return "", boxerr.Validation("name", "Skill name is required")
	}
	core := strings.NewReplacer("-", "", "_", "").Replace(name)
	ok := core != ""
	for _, r := range core {
		if !unicode.IsLetter(r) && !unicode.IsNumber(r) {
			ok = false
			break
		}
	}
	if !ok {
		return "", boxerr.Validation("name", "Skill name can only contain letters, numbers, hyphens and underscores: %q", name)
	}
	if utf8.RuneCountInString(name) > MaxNameLen {
		return "", boxerr.Validation("name", "Skill name cannot exceed %d characters", MaxNameLen)
	}
	return name, nil
}

// frontMatter is what SKILL.md's YAML header carries. The struct order is
// the order written.
type frontMatter struct {
	Name        string `yaml:"name,omitempty"`
	DisplayName string `yaml:"display_name,omitempty"`
	Description string `yaml:"description,omitempty"`
}

// ParseSkillMD splits SKILL.md into its front matter and instructions. The
// text must start with a line that is exactly "---" (ignoring surrounding
// blanks) and a later such line closes the header; otherwise the whole text
// is instructions. YAML that is not a mapping, or not YAML at all, yields no
// metadata: a broken header must not make the package unreadable.
func ParseSkillMD(text string) (meta map[string]string, instructions string) {
	meta = map[string]string{}
	if !strings.HasPrefix(text, "---") {
		return meta, text
	}
	first, rest, found := strings.Cut(text, "\n")
	if !found || strings.TrimSpace(first) != "---" {
		return meta, text
	}
	var header strings.Builder
	for {
		line, after, more := strings.Cut(rest, "\n")
		if strings.TrimSpace(line) == "---" {
			instructions = strings.TrimLeft(after, "\r\n")
			break
		}
		if !more {
			return meta, text // unterminated: no front matter
		}
		header.WriteString(line)
		header.WriteByte('\n')
		rest = after
	}
	var doc any
	if err := yaml.Unmarshal([]byte(header.String()), &doc); err != nil {
		return meta, instructions
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return meta, instructions
	}
	for _, key := range []string{"name", "display_name", "description"} {
		switch v := m[key].(type) {
		case nil:
		case string:
			meta[key] = v
		case bool, int, int64, uint64, float64:
			meta[key] = fmt.Sprint(v)
		}
	}
	return meta, instructions
}

// FormatSkillMD renders SKILL.md: a YAML header with the non-blank values of
// name, display_name and description (in that order), then a blank line and
// the instructions. With none of the three it is just the instructions.
func FormatSkillMD(name, displayName, description, instructions string) (string, error) {
	fm := frontMatter{
		Name:        blankToEmpty(name),
		DisplayName: blankToEmpty(displayName),
		Description: blankToEmpty(description),
	}
	if fm == (frontMatter{}) {
		return instructions, nil
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(fm); err != nil {
		return "", boxerr.Failure("cannot encode SKILL.md front matter: %v", err).Wrap(err)
	}
	if err := enc.Close(); err != nil {
		return "", boxerr.Failure("cannot encode SKILL.md front matter: %v", err).Wrap(err)
	}
	return "---\n" + strings.TrimRight(buf.String(), "\n") + "\n---\n\n" + instructions, nil
}

func blankToEmpty(s string) string {
	if strings.TrimSpace(s) == "" {
		return ""
	}
	return s
}

// findEntry returns the entry file name of the package open at pkg, or "".
// Symlinked entry files are accepted only when they stay inside the
// package, which os.Root enforces.
func findEntry(pkg *os.Root) string {
	for _, name := range []string{EntryFile, EntryFileLower} {
		if fi, err := pkg.Stat(name); err == nil && fi.Mode().IsRegular() {
			return name
		}
	}
	return ""
}

// hasEntry reports whether dir holds an entry file (without opening a Root;
// used by discovery, which loads the package properly afterwards).
func hasEntry(dir string) bool {
	for _, name := range []string{EntryFile, EntryFileLower} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// readText reads a regular file through pkg, refusing more than
// MaxTextBytes and non-UTF-8 content. label names the file in messages.
func readText(pkg *os.Root, rel, label, field string) (string, error) {
	// O_NONBLOCK: a FIFO planted in a package (skills are mounted into
	// sandboxes) would otherwise block the open forever; it is refused as
	// "not a regular file" just below.
	f, err := pkg.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", pathError(err, field, label)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", boxerr.Failure("stat %s: %v", label, err).Wrap(err)
	}
	if !fi.Mode().IsRegular() {
		return "", boxerr.Validation(field, "Skill file not found: %s", label)
	}
	// Read one byte more than allowed instead of trusting Stat: the file
	// may grow between the two calls.
	data, err := io.ReadAll(io.LimitReader(f, MaxTextBytes+1))
	if err != nil {
		return "", boxerr.Failure("read %s: %v", label, err).Wrap(err)
	}
	if len(data) > MaxTextBytes {
		return "", boxerr.Validation(field, "Skill file %s exceeds the %d-byte limit", label, MaxTextBytes)
	}
	if !utf8.Valid(data) {
		return "", boxerr.Validation(field, "Skill file %s is not valid UTF-8 text", label)
	}
	return string(data), nil
}

// pathError turns an error from an os.Root operation into a validation
// error naming the path: not found, or an attempt to leave the root.
func pathError(err error, field, label string) error {
	if errors.Is(err, fs.ErrNotExist) {
		return boxerr.Validation(field, "Skill file not found: %s", label).Wrap(err)
	}
	if isEscape(err) {
		return boxerr.Validation(field, "path must stay within the skill package root: %s", label).Wrap(err)
	}
	return boxerr.Failure("%s: %v", label, err).Wrap(err)
}

// isEscape recognises os.Root refusing a path that leaves the root
// (through "..", an absolute symlink or a symlink pointing outside).
func isEscape(err error) bool {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err != nil && strings.Contains(err.Error(), "escapes from parent")
}

var pythonMarkers = []string{"requirements.txt", "pyproject.toml", "setup.py", "setup.cfg"}

// loadSkill reads the package at dir (a real, absolute path). It fails when
// there is no entry file, the entry is unreadable or too large, or the
// resulting name is invalid; discovery skips such packages.
func loadSkill(dir string) (Skill, error) {
	pkg, err := os.OpenRoot(dir)
	if err != nil {
		return Skill{}, boxerr.Validation("package_root", "Directory does not exist: %s", dir).Wrap(err)
	}
	defer pkg.Close()
	entry := findEntry(pkg)
	if entry == "" {
		return Skill{}, boxerr.Validation("package_root", "No SKILL.md found in %s", dir)
	}
	text, err := readText(pkg, entry, filepath.Join(dir, entry), "package_root")
	if err != nil {
		return Skill{}, err
	}
	fi, err := pkg.Stat(entry)
	if err != nil {
		return Skill{}, boxerr.Failure("stat %s: %v", filepath.Join(dir, entry), err).Wrap(err)
	}
	meta, instructions := ParseSkillMD(text)
	name := strings.TrimSpace(meta["name"])
	if name == "" {
		name = filepath.Base(dir)
	}
	if name, err = ValidateName(name); err != nil {
		return Skill{}, err
	}
	display := strings.TrimSpace(meta["display_name"])
	if display == "" {
		display = name
	}
	python := false
	for _, m := range pythonMarkers {
		if fi, err := pkg.Stat(m); err == nil && fi.Mode().IsRegular() {
			python = true
		}
	}
	if fi, err := pkg.Stat(".venv"); err == nil && fi.IsDir() {
		python = true
	}
	return Skill{
		Name:          name,
		DisplayName:   display,
		Description:   strings.TrimSpace(meta["description"]),
		Instructions:  instructions,
		PackageRoot:   dir,
		EntryFile:     entry,
		PythonProject: python,
		CreatedAt:     isoTime(changeTime(fi)),
		UpdatedAt:     isoTime(fi.ModTime()),
		updated:       fi.ModTime(),
	}, nil
}

// isoTime formats like Python's datetime.isoformat() in UTC: "+00:00",
// microseconds only when non-zero.
func isoTime(t time.Time) string {
	t = t.UTC()
	if t.Nanosecond()/1000 == 0 {
		return t.Format("2006-01-02T15:04:05") + "+00:00"
	}
	return t.Format("2006-01-02T15:04:05.000000") + "+00:00"
}
