package test

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// skillEnv is a boxrt whose skill store lives in a temp host_root.
type skillEnv struct {
	p    *Proc
	root string // <host_root>/skills, real path
}

func newSkillEnv(t *testing.T) *skillEnv {
	t.Helper()
	host, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	cfg, _ := json.Marshal(map[string]any{"backend": "bwrap", "local": map[string]any{"host_root": host}})
	return &skillEnv{p: Start(t, Options{Stdio: true, Config: string(cfg)}), root: filepath.Join(host, "skills")}
}

func (e *skillEnv) call(t *testing.T, method string, params any) Response {
	t.Helper()
	return e.p.Call(method, params, time.Minute)
}

func (e *skillEnv) ok(t *testing.T, method string, params any) map[string]any {
	t.Helper()
	var out map[string]any
	e.p.MustCall(method, params, &out)
	return out
}

// invalid asserts a BoxValidationError (-32602) whose message contains
// every fragment.
func (e *skillEnv) invalid(t *testing.T, method string, params any, fragments ...string) *WireError {
	t.Helper()
	r := e.call(t, method, params)
	require.NotNil(t, r.Error, "%s %v: want an error, got %s", method, params, r.Result)
	assert.Equal(t, int64(-32602), r.Error.Code, r.Error.Message)
	assert.Equal(t, "BoxValidationError", r.Error.Type())
	assert.True(t, strings.HasPrefix(r.Error.Message, "BoxValidationError: "), r.Error.Message)
	for _, f := range fragments {
		assert.Contains(t, r.Error.Message, f)
	}
	return r.Error
}

// treeSnapshot describes a directory tree byte for byte.
func treeSnapshot(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
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
			lines = append(lines, "L "+rel+" -> "+target)
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
	}))
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

type zipMember struct {
	name, body string
	mode       fs.FileMode
}

func makeZip(t *testing.T, members ...zipMember) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	for _, m := range members {
		h := &zip.FileHeader{Name: m.name, Method: zip.Deflate}
		if m.mode != 0 {
			h.SetMode(m.mode)
		}
		fw, err := w.CreateHeader(h)
		require.NoError(t, err)
		_, err = fw.Write([]byte(m.body))
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// upload sends data with __file_chunk the way the reference client does:
// 16 KiB raw chunks, sequentially.
func (e *skillEnv) upload(t *testing.T, key string, data []byte) {
	t.Helper()
	n := max(1, (len(data)+16383)/16384)
	for i := 0; i < n; i++ {
		chunk := data[i*16384 : min(len(data), (i+1)*16384)]
		e.ok(t, "__file_chunk", map[string]any{"file_key": key, "file_length": len(data),
			"chunk_base64": base64.StdEncoding.EncodeToString(chunk), "chunk_index": i, "chunk_amount": n, "chunk_size": len(chunk)})
	}
}

func TestSkillMethodsRegistered(t *testing.T) {
	e := newSkillEnv(t)
	for _, m := range []string{"box_list_skills", "box_get_skill", "box_create_skill", "box_update_skill", "box_delete_skill",
		"box_scan_skill_directory", "box_list_skill_files", "box_read_skill_file", "box_write_skill_file",
		"box_preview_skill_zip", "box_install_skill_zip", "__file_chunk"} {
		r := e.call(t, m, map[string]any{"no_such_param": 1})
		require.NotNil(t, r.Error, m)
		assert.NotEqual(t, int64(-32601), r.Error.Code, "%s is not registered", m)
		assert.Equal(t, "no_such_param", r.Error.Data["field"], "%s: unknown field not named", m)
	}
}

func TestSkillCRUDOverWire(t *testing.T) {
	e := newSkillEnv(t)
	assert.Equal(t, []any{}, e.ok(t, "box_list_skills", map[string]any{})["skills"])
	assert.DirExists(t, e.root, "list creates the root")

	sk := e.ok(t, "box_create_skill", map[string]any{"skill": map[string]any{
		"name": "demo", "display_name": "Demo", "description": "Demo skill", "instructions": "Do it."}})["skill"].(map[string]any)
	assert.Equal(t, "demo", sk["name"])
	assert.Equal(t, "Demo", sk["display_name"])
	assert.Equal(t, filepath.Join(e.root, "demo"), sk["package_root"])
	assert.Equal(t, "SKILL.md", sk["entry_file"])
	assert.Equal(t, false, sk["python_project"])
	assert.True(t, strings.HasSuffix(sk["created_at"].(string), "+00:00"))
	md, err := os.ReadFile(filepath.Join(e.root, "demo", "SKILL.md"))
	require.NoError(t, err)
	assert.Equal(t, "---\nname: demo\ndisplay_name: Demo\ndescription: Demo skill\n---\n\nDo it.", string(md))

	t.Run("create errors", func(t *testing.T) {
		e.invalid(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": "demo"}}, `Skill with name "demo" already exists`)
		e.invalid(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": ""}}, "Skill name is required")
		e.invalid(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": strings.Repeat("a", 65)}}, "cannot exceed 64 characters")
		e.invalid(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": "a/b"}}, "can only contain")
		e.invalid(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": ".."}}, "can only contain")
		e.invalid(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": "x", "package_root": "/etc"}}, "package_root must stay within the skill root")
		e.invalid(t, "box_create_skill", map[string]any{}, "skill is required")
		we := e.invalid(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": "x", "colour": "red"}}, "unknown field")
		assert.Equal(t, "colour", we.Data["field"])
		e.invalid(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": 5}}, "must be a string")
	})

	t.Run("get", func(t *testing.T) {
		got := e.ok(t, "box_get_skill", map[string]any{"name": "demo"})["skill"].(map[string]any)
		assert.Equal(t, "Do it.", got["instructions"])
		assert.Nil(t, e.ok(t, "box_get_skill", map[string]any{"name": "nope"})["skill"])
		e.invalid(t, "box_get_skill", map[string]any{}, "Skill name is required")
	})

	t.Run("update", func(t *testing.T) {
		got := e.ok(t, "box_update_skill", map[string]any{"name": "demo", "skill": map[string]any{"instructions": "Do it better."}})["skill"].(map[string]any)
		assert.Equal(t, "Do it better.", got["instructions"])
		assert.Equal(t, "Demo skill", got["description"], "fields not given are kept")
		// An object read back from box_get_skill can be sent as is.
		back := e.ok(t, "box_get_skill", map[string]any{"name": "demo"})["skill"].(map[string]any)
		back["description"] = "Round trip"
		got = e.ok(t, "box_update_skill", map[string]any{"name": "demo", "skill": back})["skill"].(map[string]any)
		assert.Equal(t, "Round trip", got["description"])
		e.invalid(t, "box_update_skill", map[string]any{"name": "demo", "skill": map[string]any{"name": "renamed"}}, "Renaming skills is not supported")
		require.NoError(t, os.MkdirAll(filepath.Join(e.root, "elsewhere"), 0o755))
		e.invalid(t, "box_update_skill", map[string]any{"name": "demo", "skill": map[string]any{"package_root": filepath.Join(e.root, "elsewhere")}}, "Updating package_root is not supported")
		e.invalid(t, "box_update_skill", map[string]any{"name": "ghost", "skill": map[string]any{}}, `Skill "ghost" not found`)
	})

	t.Run("scan", func(t *testing.T) {
		got := e.ok(t, "box_scan_skill_directory", map[string]any{"path": filepath.Join(e.root, "demo")})
		assert.Equal(t, "demo", got["name"], "the skill object itself, not wrapped")
		e.invalid(t, "box_scan_skill_directory", map[string]any{"path": "/etc"}, "scan path must stay within the skill root")
		outside := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(outside, "SKILL.md"), []byte("---\nname: outside\n---\n"), 0o644))
		require.NoError(t, os.Symlink(outside, filepath.Join(e.root, "escape")))
		e.invalid(t, "box_scan_skill_directory", map[string]any{"path": filepath.Join(e.root, "escape")}, "must stay within the skill root")
		e.invalid(t, "box_scan_skill_directory", map[string]any{"path": filepath.Join(e.root, "elsewhere")}, "No SKILL.md found")
	})

	t.Run("delete", func(t *testing.T) {
		e.ok(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": "doomed"}})
		assert.Equal(t, map[string]any{"deleted": "doomed"}, e.ok(t, "box_delete_skill", map[string]any{"name": "doomed"}))
		assert.NoDirExists(t, filepath.Join(e.root, "doomed"))
		e.invalid(t, "box_delete_skill", map[string]any{"name": "doomed"}, `Skill "doomed" not found`)
		e.invalid(t, "box_delete_skill", map[string]any{"name": ".."}, "can only contain")
		e.invalid(t, "box_delete_skill", map[string]any{"name": "../demo"}, "can only contain")
	})
}

func TestSkillFilesOverWire(t *testing.T) {
	e := newSkillEnv(t)
	e.ok(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": "demo", "instructions": "x"}})
	pkg := filepath.Join(e.root, "demo")
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("secret"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(pkg, "leak.txt")))
	require.NoError(t, os.Symlink(outside, filepath.Join(pkg, "outdir")))
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "latin1.txt"), []byte("caf\xe9"), 0o644))

	w := e.ok(t, "box_write_skill_file", map[string]any{"name": "demo", "path": "docs/guide.md", "content": "héllo"})
	assert.Equal(t, map[string]any{"skill": map[string]any{"name": "demo"}, "path": "docs/guide.md", "bytes_written": float64(6)}, w)
	r := e.ok(t, "box_read_skill_file", map[string]any{"name": "demo", "path": "docs/guide.md"})
	assert.Equal(t, "héllo", r["content"])
	assert.Equal(t, "docs/guide.md", r["path"])
	e.ok(t, "box_write_skill_file", map[string]any{"name": "demo", "path": "max.txt", "content": strings.Repeat("m", 1<<20)})

	l := e.ok(t, "box_list_skill_files", map[string]any{"name": "demo", "path": ".", "include_hidden": false, "max_entries": 200})
	var names []string
	for _, en := range l["entries"].([]any) {
		names = append(names, en.(map[string]any)["name"].(string))
	}
	assert.Equal(t, []string{"SKILL.md", "docs", "latin1.txt", "leak.txt", "max.txt", "outdir"}, names)
	assert.Equal(t, false, l["truncated"])
	assert.Equal(t, ".", l["base_path"])
	l = e.ok(t, "box_list_skill_files", map[string]any{"name": "demo", "max_entries": 1})
	assert.Equal(t, true, l["truncated"])
	assert.Len(t, l["entries"], 1)

	for _, tc := range []struct {
		name, method string
		params       map[string]any
		want         string
	}{
		{"read traversal", "box_read_skill_file", map[string]any{"name": "demo", "path": "../../etc/passwd"}, "must stay within the skill package root"},
		{"read absolute", "box_read_skill_file", map[string]any{"name": "demo", "path": "/etc/passwd"}, "must be relative"},
		{"read symlink out", "box_read_skill_file", map[string]any{"name": "demo", "path": "leak.txt"}, "must stay within the skill package root"},
		{"read through dir symlink", "box_read_skill_file", map[string]any{"name": "demo", "path": "outdir/secret.txt"}, "must stay within the skill package root"},
		{"read non-UTF-8", "box_read_skill_file", map[string]any{"name": "demo", "path": "latin1.txt"}, "not valid UTF-8"},
		{"read missing", "box_read_skill_file", map[string]any{"name": "demo", "path": "nope.md"}, "Skill file not found: nope.md"},
		{"read unknown skill", "box_read_skill_file", map[string]any{"name": "ghost", "path": "a"}, `Skill "ghost" not found`},
		{"write traversal", "box_write_skill_file", map[string]any{"name": "demo", "path": "../escape.txt", "content": "x"}, "must stay within the skill package root"},
		{"write absolute", "box_write_skill_file", map[string]any{"name": "demo", "path": "/tmp/x.txt", "content": "x"}, "must be relative"},
		{"write through dir symlink", "box_write_skill_file", map[string]any{"name": "demo", "path": "outdir/new.txt", "content": "x"}, "must stay within the skill package root"},
		{"write symlink out", "box_write_skill_file", map[string]any{"name": "demo", "path": "leak.txt", "content": "x"}, "must stay within the skill package root"},
		{"write oversize", "box_write_skill_file", map[string]any{"name": "demo", "path": "big.txt", "content": strings.Repeat("b", 1<<20+1)}, "exceeds the 1048576-byte limit"},
		{"write NUL path", "box_write_skill_file", map[string]any{"name": "demo", "path": "a\x00b", "content": "x"}, "NUL"},
		{"list traversal", "box_list_skill_files", map[string]any{"name": "demo", "path": ".."}, "must stay within the skill package root"},
		{"list symlink out", "box_list_skill_files", map[string]any{"name": "demo", "path": "outdir"}, "must stay within the skill package root"},
		{"list missing", "box_list_skill_files", map[string]any{"name": "demo", "path": "nope"}, "Skill directory not found: nope"},
		{"list max_entries 0", "box_list_skill_files", map[string]any{"name": "demo", "max_entries": 0}, "positive integer"},
		{"list max_entries string", "box_list_skill_files", map[string]any{"name": "demo", "max_entries": "5"}, "max_entries"},
	} {
		t.Run(tc.name, func(t *testing.T) { e.invalid(t, tc.method, tc.params, tc.want) })
	}
	b, _ := os.ReadFile(filepath.Join(outside, "secret.txt"))
	assert.Equal(t, "secret", string(b))
	assert.NoFileExists(t, filepath.Join(outside, "new.txt"))
	assert.NoFileExists(t, filepath.Join(filepath.Dir(e.root), "escape.txt"))
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "big.txt"), bytes.Repeat([]byte("b"), 1<<20+1), 0o644))
	e.invalid(t, "box_read_skill_file", map[string]any{"name": "demo", "path": "big.txt"}, "exceeds the 1048576-byte limit")
}

func TestSkillZipOverWire(t *testing.T) {
	e := newSkillEnv(t)
	e.ok(t, "box_list_skills", map[string]any{})
	single := makeZip(t,
		zipMember{name: "zipped/SKILL.md", body: "---\nname: zipped\ndescription: From a zip\n---\n\nbody"},
		zipMember{name: "zipped/run.sh", body: "#!/bin/sh\n", mode: 0o755})

	// Preview inline: nothing lands in the store.
	before := treeSnapshot(t, e.root)
	prev := e.ok(t, "box_preview_skill_zip", map[string]any{"zip_base64": base64.StdEncoding.EncodeToString(single), "filename": "zipped.zip"})
	list := prev["skills"].([]any)
	require.Len(t, list, 1)
	first := list[0].(map[string]any)
	assert.Equal(t, "zipped", first["name"])
	assert.Equal(t, "", first["source_path"])
	assert.Equal(t, filepath.Join(e.root, "zipped-upload"), first["package_root"])
	assert.Equal(t, before, treeSnapshot(t, e.root))

	// Install through __file_chunk, several chunks.
	var pad strings.Builder
	for i := 0; pad.Len() < 40000; i++ {
		fmt.Fprintf(&pad, "%d ", i*104729%1000003)
	}
	multi := makeZip(t,
		zipMember{name: "repo-main/packages/alpha/SKILL.md", body: "---\nname: alpha\n---\nA"},
		zipMember{name: "repo-main/packages/beta/SKILL.md", body: "---\nname: beta\n---\nB"},
		zipMember{name: "repo-main/packages/beta/numbers.txt", body: pad.String()})
	require.Greater(t, len(multi), 16384, "the archive must need several chunks")
	key := "0123456789abcdef-0123456789abcdef0123456789abcdef.zip"
	e.upload(t, key, multi)
	prev = e.ok(t, "box_preview_skill_zip", map[string]any{"file_key": key, "filename": "repo.zip", "source_subdir": "packages"})
	require.Len(t, prev["skills"], 2)
	assert.Equal(t, "packages/alpha", prev["skills"].([]any)[0].(map[string]any)["source_path"])
	// The preview consumed the upload.
	e.invalid(t, "box_install_skill_zip", map[string]any{"file_key": key, "filename": "repo.zip"}, "Uploaded file not found")
	e.upload(t, key, multi)
	e.invalid(t, "box_install_skill_zip", map[string]any{"file_key": key, "filename": "repo.zip"}, "Multiple skills found")
	e.upload(t, key, multi)
	inst := e.ok(t, "box_install_skill_zip", map[string]any{"file_key": key, "filename": "repo.zip", "source_paths": []string{"packages/beta"}})
	require.Len(t, inst["skills"], 1)
	beta := inst["skills"].([]any)[0].(map[string]any)
	assert.Equal(t, "beta", beta["name"])
	assert.Equal(t, filepath.Join(e.root, "repo-beta-upload"), beta["package_root"])
	got, err := os.ReadFile(filepath.Join(e.root, "repo-beta-upload", "numbers.txt"))
	require.NoError(t, err)
	assert.Equal(t, pad.String(), string(got))
	inst = e.ok(t, "box_install_skill_zip", map[string]any{"zip_base64": base64.StdEncoding.EncodeToString(single), "filename": "zipped.zip"})
	assert.Equal(t, "zipped", inst["skills"].([]any)[0].(map[string]any)["name"])
	fi, err := os.Stat(filepath.Join(e.root, "zipped-upload", "run.sh"))
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o755), fi.Mode().Perm())

	t.Run("source errors", func(t *testing.T) {
		e.invalid(t, "box_preview_skill_zip", map[string]any{}, "file_key")
		e.invalid(t, "box_preview_skill_zip", map[string]any{"file_key": "a.zip", "zip_base64": "AAAA"}, "not both")
		e.invalid(t, "box_preview_skill_zip", map[string]any{"zip_base64": "%%%"}, "not valid base64")
		e.invalid(t, "box_preview_skill_zip", map[string]any{"file_key": "../x.zip"}, "Invalid file transfer key")
	})

	t.Run("file chunk errors", func(t *testing.T) {
		e.invalid(t, "__file_chunk", map[string]any{"file_key": "../evil", "chunk_base64": "", "chunk_index": 0, "chunk_amount": 1}, "Invalid file transfer key")
		we := e.invalid(t, "__file_chunk", map[string]any{"file_key": "k.zip", "chunk_base64": "", "chunk_index": "0", "chunk_amount": 1})
		assert.Equal(t, "chunk_index", we.Data["field"])
		e.invalid(t, "__file_chunk", map[string]any{"file_key": "k.zip", "chunk_base64": "", "chunk_index": 1, "chunk_amount": 1}, "Invalid file chunk position")
		e.invalid(t, "__file_chunk", map[string]any{"file_key": "k.zip", "chunk_base64": strings.Repeat("A", 21852), "chunk_index": 0, "chunk_amount": 1}, "protocol limit")
	})

	t.Run("hostile archives leave the store untouched", func(t *testing.T) {
		hostile := map[string][]byte{
			"traversal": makeZip(t, zipMember{name: "evil/SKILL.md", body: "---\nname: evil\n---\n"}, zipMember{name: "../../escape.txt", body: "x"}),
			"absolute":  makeZip(t, zipMember{name: "evil/SKILL.md", body: "---\nname: evil\n---\n"}, zipMember{name: "/tmp/escape.txt", body: "x"}),
			"symlink": makeZip(t, zipMember{name: "evil/SKILL.md", body: "---\nname: evil\n---\n"},
				zipMember{name: "evil/link", body: "/etc/passwd", mode: fs.ModeSymlink | 0o777}),
			"duplicate": makeZip(t, zipMember{name: "evil/SKILL.md", body: "---\nname: evil\n---\n"},
				zipMember{name: "evil/a", body: "1"}, zipMember{name: "evil/a", body: "2"}),
			"not a zip": []byte("plain text"),
		}
		before := treeSnapshot(t, e.root)
		for name, data := range hostile {
			e.invalid(t, "box_install_skill_zip", map[string]any{"zip_base64": base64.StdEncoding.EncodeToString(data), "filename": name + ".zip"})
			e.upload(t, "hostile.zip", data)
			e.invalid(t, "box_install_skill_zip", map[string]any{"file_key": "hostile.zip", "filename": name + ".zip"})
			e.invalid(t, "box_preview_skill_zip", map[string]any{"file_key": "hostile.zip"}, "Uploaded file not found")
			assert.Equal(t, before, treeSnapshot(t, e.root), name)
		}
		assert.NoFileExists(t, filepath.Join(filepath.Dir(e.root), "escape.txt"))
	})
}

func TestSkillRootFollowsBoxInit(t *testing.T) {
	e := newSkillEnv(t)
	e.ok(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": "first"}})
	e.ok(t, "box_init", map[string]any{"local": map[string]any{"skills_root": "other-skills"}})
	assert.Equal(t, []any{}, e.ok(t, "box_list_skills", map[string]any{})["skills"])
	sk := e.ok(t, "box_create_skill", map[string]any{"skill": map[string]any{"name": "second"}})["skill"].(map[string]any)
	assert.Equal(t, filepath.Join(filepath.Dir(e.root), "other-skills", "second"), sk["package_root"])
}

// TestSkillStoreDefaultsUnderStateDir: without local.host_root the skill
// store is <state dir>/skills, not ./data/box/skills under the working
// directory; box_init's host_root then moves it there.
func TestSkillStoreDefaultsUnderStateDir(t *testing.T) {
	state, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	cwd, host := t.TempDir(), t.TempDir()
	p := Start(t, Options{Stdio: true, StateDir: state, Dir: cwd, Config: `{"backend":"bwrap"}`})
	var created struct {
		Skill map[string]any `json:"skill"`
	}
	p.MustCall("box_create_skill", map[string]any{"skill": map[string]any{"name": "demo"}}, &created)
	assert.Equal(t, filepath.Join(state, "skills", "demo"), created.Skill["package_root"])
	assert.FileExists(t, filepath.Join(state, "skills", "demo", "SKILL.md"))
	assert.NoDirExists(t, filepath.Join(cwd, "data"), "nothing under the working directory")

	p.MustCall("box_init", map[string]any{"local": map[string]any{"host_root": host}}, nil)
	p.MustCall("box_create_skill", map[string]any{"skill": map[string]any{"name": "moved"}}, &created)
	want, err := filepath.EvalSymlinks(host)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(want, "skills", "moved"), created.Skill["package_root"], "an explicit host_root wins")
}

// TestSkillInSession mounts a skill into a session: the sandbox reads its
// SKILL.md and runs its script; the mount is read-only unless asked for rw.
func TestSkillInSession(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		root := t.TempDir()
		require.NoError(t, os.Chmod(root, 0o755))
		p := Start(t, Options{Stdio: true, Config: fmt.Sprintf(`{%s,"local":{"host_root":%q}}`, backendConfigs[backend], root)})
		p.MustCall("box_create_skill", map[string]any{"skill": map[string]any{
			"name": "greeter", "description": "says hello", "instructions": "Run run.sh."}}, nil)
		p.MustCall("box_write_skill_file", map[string]any{"name": "greeter", "path": "run.sh",
			"content": "#!/bin/sh\necho \"hello from $(basename \"$(dirname \"$0\")\")\"\n"}, nil)

		sid := "with-skill-" + backend
		r := execIn(t, p, map[string]any{"session_id": sid, "skill_name": "greeter",
			"cmd": "head -3 .skills/greeter/SKILL.md; sh .skills/greeter/run.sh; touch .skills/greeter/x 2>/dev/null && echo writable || echo read-only"})
		require.Equal(t, 0, *r.ExitCode, "%+v", r)
		assert.Contains(t, r.Stdout, "name: greeter")
		assert.Contains(t, r.Stdout, "hello from greeter\n")
		assert.True(t, strings.HasSuffix(r.Stdout, "read-only\n"), r.Stdout)

		// Files written in the session survive while the skill stays mounted;
		// the same skill named again changes nothing.
		execIn(t, p, map[string]any{"session_id": sid, "cmd": "echo state > /workspace/state"})
		r = execIn(t, p, map[string]any{"session_id": sid, "skill_name": "greeter", "cmd": "cat /workspace/state"})
		assert.Equal(t, "state\n", r.Stdout)

		var info map[string]any
		p.MustCall("box_get_backend_info", map[string]any{}, &info)
		if info["skills_live"] == true {
			// Adding a skill does not recreate the session: its state is kept.
			p.MustCall("box_create_skill", map[string]any{"skill": map[string]any{"name": "second", "instructions": "x"}}, nil)
			r = execIn(t, p, map[string]any{"session_id": sid, "skills": []map[string]any{{"name": "second", "mode": "rw"}},
				"cmd": "cat /workspace/state; touch .skills/second/x && echo rw-ok; ls .skills"})
			assert.Equal(t, "state\nrw-ok\ngreeter\nsecond\n", r.Stdout)
		}
		r2 := p.Call("box_exec", map[string]any{"session_id": sid, "skill_name": "missing", "cmd": "true"}, time.Minute)
		require.NotNil(t, r2.Error)
		assert.Equal(t, "BoxValidationError", r2.Error.Type())
	})
}
