package skills

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func demoZip(t *testing.T) []byte {
	return buildZip(t,
		zipFile{name: "demo/SKILL.md", body: skillMD("demo", "Demo skill", "Do it.")},
		zipFile{name: "demo/scripts/", mode: fs.ModeDir | 0o755},
		zipFile{name: "demo/scripts/run.sh", body: "#!/bin/sh\necho hi\n", mode: 0o755},
		zipFile{name: "demo/requirements.txt", body: "requests\n"},
	)
}

func repoZip(t *testing.T) []byte {
	return buildZip(t,
		zipFile{name: "repo-main/README.md", body: "repo"},
		zipFile{name: "repo-main/packages/alpha/SKILL.md", body: skillMD("alpha", "A", "alpha body")},
		zipFile{name: "repo-main/packages/beta/SKILL.md", body: skillMD("beta", "B", "beta body")},
		zipFile{name: "repo-main/packages/beta/lib/util.py", body: "x = 1\n"},
	)
}

func TestZipSingleSkill(t *testing.T) {
	s, root := testStore(t)
	before := snapshot(t, root)
	prev, err := s.PreviewZip(bg, ZipSource{Data: demoZip(t)}, ZipOptions{Filename: "demo.zip", TargetSuffix: "upload"})
	if err != nil {
		t.Fatal(err)
	}
	if len(prev) != 1 || prev[0].Name != "demo" || prev[0].SourcePath != "" || prev[0].PackageRoot != filepath.Join(root, "demo-upload") ||
		!prev[0].PythonProject || prev[0].Description != "Demo skill" {
		t.Fatalf("preview: %+v", prev)
	}
	if snapshot(t, root) != before {
		t.Fatal("preview wrote to the store")
	}
	got, err := s.InstallZip(bg, ZipSource{Base64: base64.StdEncoding.EncodeToString(demoZip(t))}, ZipOptions{Filename: "demo.zip", TargetSuffix: "upload"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "demo" || got[0].PackageRoot != filepath.Join(root, "demo-upload") {
		t.Fatalf("install: %+v", got)
	}
	fi, err := os.Stat(filepath.Join(root, "demo-upload", "scripts", "run.sh"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("run.sh: %v %v", fi, err)
	}
	if fi, _ := os.Stat(filepath.Join(root, "demo-upload", "SKILL.md")); fi.Mode().Perm() != 0o644 {
		t.Fatalf("SKILL.md mode %v", fi.Mode())
	}
	// A second install of the same archive collides (name and directory).
	before = snapshot(t, root)
	_, err = s.InstallZip(bg, ZipSource{Data: demoZip(t)}, ZipOptions{Filename: "demo.zip", TargetSuffix: "upload"})
	wantValidation(t, err, `Skill with name "demo" already exists`)
	_, err = s.InstallZip(bg, ZipSource{Data: demoZip(t)}, ZipOptions{Filename: "other.zip", TargetSuffix: "v2"})
	wantValidation(t, err, "already exists")
	if snapshot(t, root) != before {
		t.Fatal("failed install changed the store")
	}
	assertNoStaging(t, s, root)
}

func TestZipMultiSkill(t *testing.T) {
	s, root := testStore(t)
	prev, err := s.PreviewZip(bg, ZipSource{Data: repoZip(t)}, ZipOptions{Filename: "repo.zip", SourceSubdir: "/packages/", TargetSuffix: "upload"})
	if err != nil {
		t.Fatal(err)
	}
	if len(prev) != 2 || prev[0].SourcePath != "packages/alpha" || prev[1].SourcePath != "packages/beta" ||
		prev[0].PackageRoot != filepath.Join(root, "repo-alpha-upload") || prev[1].PackageRoot != filepath.Join(root, "repo-beta-upload") {
		t.Fatalf("preview: %+v", prev)
	}
	before := snapshot(t, root)
	for _, tc := range []struct {
		opts ZipOptions
		want string
	}{
		{ZipOptions{Filename: "repo.zip"}, "Multiple skills found. Please choose one or more source_paths: packages/alpha, packages/beta"},
		{ZipOptions{Filename: "repo.zip", SourcePaths: []string{"packages/gamma"}}, `Invalid source_path "packages/gamma". Available: packages/alpha, packages/beta`},
		{ZipOptions{Filename: "repo.zip", SourceSubdir: "../x"}, "source_subdir must stay within the uploaded archive"},
		{ZipOptions{Filename: "repo.zip", SourceSubdir: "nope"}, "source_subdir does not exist in the uploaded archive: nope"},
		{ZipOptions{Filename: "repo.zip", SourceSubdir: "README.md"}, "does not exist"},
		// One good and one bad selection: nothing is installed.
		{ZipOptions{Filename: "repo.zip", SourcePaths: []string{"packages/alpha", "bogus"}}, "Invalid source_path"},
	} {
		_, err := s.InstallZip(bg, ZipSource{Data: repoZip(t)}, tc.opts)
		wantValidation(t, err, tc.want)
	}
	if snapshot(t, root) != before {
		t.Fatal("failed installs changed the store")
	}
	got, err := s.InstallZip(bg, ZipSource{Data: repoZip(t)}, ZipOptions{Filename: "repo.zip", SourceSubdir: "packages",
		SourcePaths: []string{"\\packages\\beta\\", "packages/beta"}, TargetSuffix: "upload"})
	if err != nil || len(got) != 1 || got[0].Name != "beta" || got[0].PackageRoot != filepath.Join(root, "repo-beta-upload") {
		t.Fatalf("install beta: %+v %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(root, "repo-beta-upload", "lib", "util.py")); err != nil {
		t.Fatal(err)
	}
	// Legacy source_path.
	got, err = s.InstallZip(bg, ZipSource{Data: repoZip(t)}, ZipOptions{Filename: "repo.zip", SourcePath: "packages/alpha", TargetSuffix: ""})
	if err != nil || len(got) != 1 || got[0].PackageRoot != filepath.Join(root, "repo-alpha") {
		t.Fatalf("install alpha: %+v %v", got, err)
	}
	assertNoStaging(t, s, root)
}

// assertNoStaging checks that no extraction or staging directory is left.
func assertNoStaging(t *testing.T, s *Store, root string) {
	t.Helper()
	des, _ := os.ReadDir(root)
	for _, d := range des {
		if strings.HasPrefix(d.Name(), internalPrefix) {
			t.Errorf("left in the store: %s", d.Name())
		}
	}
	if s.priv != "" {
		des, _ := os.ReadDir(s.priv)
		for _, d := range des {
			if strings.HasPrefix(d.Name(), "extract-") {
				t.Errorf("extraction dir left: %s", d.Name())
			}
		}
	}
}

// zeroDeflate returns a raw deflate stream of size zero bytes (a multiple
// of 1 MiB) built by repeating one independently compressed 1 MiB block,
// so a 1 GiB entry costs about 1 MiB of memory, and the CRC of the data.
func zeroDeflate(t *testing.T, size int64) ([]byte, uint32) {
	t.Helper()
	zeros := make([]byte, 1<<20)
	var blk bytes.Buffer
	fw, _ := flate.NewWriter(&blk, flate.BestCompression)
	fw.Write(zeros)
	fw.Flush() // sync flush: a non-final block boundary, no shared history
	body := append([]byte(nil), blk.Bytes()...)
	fw.Close()
	tail := append([]byte(nil), blk.Bytes()[len(body):]...) // the final empty block
	var out bytes.Buffer
	crc := uint32(0)
	for i := int64(0); i < size>>20; i++ {
		out.Write(body)
		crc = crc32.Update(crc, crc32.IEEETable, zeros)
	}
	out.Write(tail)
	return out.Bytes(), crc
}

// rawEntry adds an entry whose header fields are taken as given.
func rawEntry(t *testing.T, w *zip.Writer, h *zip.FileHeader, data []byte) {
	t.Helper()
	fw, err := w.CreateRaw(h)
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(data)
}

func TestZeroDeflateBuilderIsGenuine(t *testing.T) {
	// The bomb builder must produce a real stream; checked small, with
	// limits loosened so extraction accepts it.
	data, crc := zeroDeflate(t, 4<<20)
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	zf := zipFile{name: "demo/SKILL.md", body: skillMD("demo", "d", "b")}
	fw, _ := w.Create(zf.name)
	fw.Write([]byte(zf.body))
	rawEntry(t, w, &zip.FileHeader{Name: "demo/zeros.bin", Method: zip.Deflate, CRC32: crc,
		CompressedSize64: uint64(len(data)), UncompressedSize64: 4 << 20}, data)
	w.Close()
	lim := DefaultLimits()
	lim.MaxZipRatio = 10000
	s, root := testStoreLimits(t, lim)
	if _, err := s.InstallZip(bg, ZipSource{Data: buf.Bytes()}, ZipOptions{Filename: "demo.zip"}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "demo", "zeros.bin"))
	if err != nil || fi.Size() != 4<<20 {
		t.Fatalf("zeros.bin: %v %v", fi, err)
	}
}

// hostileCase builds an archive that must be refused.
type hostileCase struct {
	name  string
	build func(t *testing.T) []byte
	want  string
	lim   func(*Limits)
}

func withSkill(t *testing.T, extra func(w *zip.Writer)) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	fw, _ := w.Create("demo/SKILL.md")
	fw.Write([]byte(skillMD("evil", "d", "b")))
	extra(w)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func plain(name, body string) func(w *zip.Writer) {
	return func(w *zip.Writer) {
		fw, _ := w.Create(name)
		fw.Write([]byte(body))
	}
}

func withMode(name, body string, mode fs.FileMode) func(w *zip.Writer) {
	return func(w *zip.Writer) {
		h := &zip.FileHeader{Name: name, Method: zip.Store}
		h.SetMode(mode)
		fw, _ := w.CreateHeader(h)
		fw.Write([]byte(body))
	}
}

func hostileCases() []hostileCase {
	return []hostileCase{
		{"parent traversal", func(t *testing.T) []byte { return withSkill(t, plain("../evil.txt", "x")) }, "escapes the extraction directory", nil},
		{"nested traversal", func(t *testing.T) []byte { return withSkill(t, plain("demo/../../evil.txt", "x")) }, "escapes the extraction directory", nil},
		{"backslash traversal", func(t *testing.T) []byte { return withSkill(t, plain(`demo\..\..\evil.txt`, "x")) }, "escapes the extraction directory", nil},
		{"absolute path", func(t *testing.T) []byte { return withSkill(t, plain("/tmp/evil.txt", "x")) }, "absolute path", nil},
		{"drive path", func(t *testing.T) []byte { return withSkill(t, plain("C:/evil.txt", "x")) }, "drive path", nil},
		{"NUL in name", func(t *testing.T) []byte { return withSkill(t, plain("demo/a\x00b", "x")) }, "NUL", nil},
		{"symlink entry", func(t *testing.T) []byte {
			return withSkill(t, withMode("demo/link", "/etc/passwd", fs.ModeSymlink|0o777))
		}, "symlink", nil},
		{"named pipe entry", func(t *testing.T) []byte {
			return withSkill(t, withMode("demo/fifo", "", fs.ModeNamedPipe|0o644))
		}, "not a regular file or directory", nil},
		{"513 entries", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) {
				for i := 0; i < 512; i++ {
					plain(fmt.Sprintf("demo/f%03d.txt", i), "x")(w)
				}
			})
		}, "too many entries (513 > 512)", nil},
		{"duplicate names", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) { plain("demo/a.txt", "one")(w); plain("demo/a.txt", "two")(w) })
		}, "Duplicate archive entry", nil},
		{"duplicate after cleaning", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) { plain("demo/a.txt", "one")(w); plain("demo/./a.txt", "two")(w) })
		}, "Duplicate archive entry", nil},
		{"file and directory", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) { plain("demo/a", "one")(w); plain("demo/a/b", "two")(w) })
		}, "both a file and a directory", nil},
		{"1 GiB of zeros (ratio bomb)", func(t *testing.T) []byte {
			data, crc := zeroDeflate(t, 1<<30)
			return withSkill(t, func(w *zip.Writer) {
				rawEntry(t, w, &zip.FileHeader{Name: "demo/zeros.bin", Method: zip.Deflate, CRC32: crc,
					CompressedSize64: uint64(len(data)), UncompressedSize64: 1 << 30}, data)
			})
		}, "exceeds the uncompressed size limit", nil},
		{"ratio over 100", func(t *testing.T) []byte {
			data, crc := zeroDeflate(t, 4<<20)
			return withSkill(t, func(w *zip.Writer) {
				rawEntry(t, w, &zip.FileHeader{Name: "demo/zeros.bin", Method: zip.Deflate, CRC32: crc,
					CompressedSize64: uint64(len(data)), UncompressedSize64: 4 << 20}, data)
			})
		}, "compression ratio limit (100)", nil},
		{"declared size smaller than the data", func(t *testing.T) []byte {
			// 4 MiB of zeros declared as 5000 bytes: every declared number
			// passes, only the actual output gives it away.
			data, crc := zeroDeflate(t, 4<<20)
			return withSkill(t, func(w *zip.Writer) {
				rawEntry(t, w, &zip.FileHeader{Name: "demo/lies.bin", Method: zip.Deflate, CRC32: crc,
					CompressedSize64: uint64(len(data)), UncompressedSize64: 5000}, data)
			})
		}, "larger than its declared size (5000 bytes)", nil},
		{"declared size larger than the data", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) {
				rawEntry(t, w, &zip.FileHeader{Name: "demo/short.bin", Method: zip.Store, CRC32: crc32.ChecksumIEEE([]byte("abc")),
					CompressedSize64: 3, UncompressedSize64: 2}, []byte("abc"))
			})
		}, "larger than its declared size", nil},
		{"stored data shorter than declared", func(t *testing.T) []byte {
			var comp bytes.Buffer
			fw, _ := flate.NewWriter(&comp, flate.BestSpeed)
			fw.Write([]byte("hello"))
			fw.Close()
			return withSkill(t, func(w *zip.Writer) {
				rawEntry(t, w, &zip.FileHeader{Name: "demo/short.txt", Method: zip.Deflate, CRC32: crc32.ChecksumIEEE([]byte("hello")),
					CompressedSize64: uint64(comp.Len()), UncompressedSize64: 50}, comp.Bytes())
			})
		}, "smaller than its declared size", nil},
		{"bad CRC", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) {
				rawEntry(t, w, &zip.FileHeader{Name: "demo/crc.txt", Method: zip.Store, CRC32: 12345,
					CompressedSize64: 3, UncompressedSize64: 3}, []byte("abc"))
			})
		}, "CRC-32", nil},
		{"non-empty entry with compressed size 0", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) {
				rawEntry(t, w, &zip.FileHeader{Name: "demo/zero.txt", Method: zip.Store, UncompressedSize64: 3}, nil)
			})
		}, "compressed size of 0", nil},
		{"unsupported method", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) {
				rawEntry(t, w, &zip.FileHeader{Name: "demo/x.bz2", Method: 12, CompressedSize64: 3, UncompressedSize64: 3}, []byte("abc"))
			})
		}, "unsupported compression method", nil},
		{"entry over a lowered per-entry limit", func(t *testing.T) []byte {
			return withSkill(t, plain("demo/big.txt", strings.Repeat("ab", 600)))
		}, "exceeds the uncompressed size limit (1000 bytes)", func(l *Limits) { l.MaxZipEntryBytes = 1000 }},
		{"total over a lowered total limit", func(t *testing.T) []byte {
			return withSkill(t, func(w *zip.Writer) { plain("demo/a.txt", "abcdefgh")(w); plain("demo/b.txt", "abcdefgh")(w) })
		}, "total uncompressed size limit (30 bytes)", func(l *Limits) { l.MaxZipTotalBytes = 30 }},
		{"archive over a lowered compressed limit", func(t *testing.T) []byte {
			return withSkill(t, plain("demo/a.txt", "x"))
		}, "compressed size limit (100 bytes)", func(l *Limits) { l.MaxZipBytes = 100 }},
		{"entries over a lowered count", func(t *testing.T) []byte {
			return withSkill(t, plain("demo/a.txt", "x"))
		}, "too many entries (2 > 1)", func(l *Limits) { l.MaxZipEntries = 1 }},
		{"empty upload", func(t *testing.T) []byte { return []byte{} }, "Uploaded file is empty", nil},
		{"not a zip", func(t *testing.T) []byte { return []byte("this is not a zip archive") }, "must be a valid .zip archive", nil},
		{"no skill", func(t *testing.T) []byte { return buildZip(t, zipFile{name: "readme.txt", body: "x"}) }, "No SKILL.md found in the uploaded archive", nil},
		{"invalid skill name", func(t *testing.T) []byte {
			return buildZip(t, zipFile{name: "x/SKILL.md", body: skillMD("bad name!", "d", "b")})
		}, "is invalid", nil},
	}
}

func TestZipHostileArchivesRefused(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			lim := DefaultLimits()
			if tc.lim != nil {
				tc.lim(&lim)
			}
			s, root := testStoreLimits(t, lim)
			mustCreate(t, s, "existing", "keep me")
			before := snapshot(t, root)
			data := tc.build(t)
			for _, op := range []string{"preview", "install"} {
				var err error
				if op == "preview" {
					_, err = s.PreviewZip(bg, ZipSource{Data: data}, ZipOptions{Filename: "evil.zip", TargetSuffix: "upload"})
				} else {
					_, err = s.InstallZip(bg, ZipSource{Data: data}, ZipOptions{Filename: "evil.zip", TargetSuffix: "upload"})
				}
				wantValidation(t, err, tc.want)
				if after := snapshot(t, root); after != before {
					t.Fatalf("%s changed the store:\nbefore:\n%s\nafter:\n%s", op, before, after)
				}
				assertNoStaging(t, s, root)
			}
		})
	}
}

func TestZipEmptyBase64AndBothSources(t *testing.T) {
	s, _ := testStore(t)
	_, err := s.PreviewZip(bg, ZipSource{Data: []byte{}}, ZipOptions{})
	wantValidation(t, err, "Uploaded file is empty")
	_, err = s.PreviewZip(bg, ZipSource{Base64: "!!!"}, ZipOptions{})
	wantValidation(t, err, "not valid base64")
	_, err = s.PreviewZip(bg, ZipSource{Base64: "AAAA", FileKey: "k.zip"}, ZipOptions{})
	wantValidation(t, err, "exactly one of")
	lim := DefaultLimits()
	lim.MaxZipBytes = 10
	s2, _ := testStoreLimits(t, lim)
	_, err = s2.PreviewZip(bg, ZipSource{Base64: strings.Repeat("A", 100)}, ZipOptions{})
	wantValidation(t, err, "compressed size limit (10 bytes)")
}

func TestZipEntryNames(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"a/b.txt", "a/b.txt", ""},
		{`a\b.txt`, "a/b.txt", ""},
		{"./a/./b", "a/b", ""},
		{"a/", "a", ""},
		{"", "", "empty name"},
		{".", "", "escapes"},
		{"..", "", "escapes"},
		{"../a", "", "escapes"},
		{"a/../../b", "", "escapes"},
		{"/a", "", "absolute"},
		{`\a`, "", "absolute"},
		{"c:x", "", "drive"},
	} {
		got, _, err := cleanEntryName(tc.in)
		if tc.err != "" {
			wantValidation(t, err, tc.err)
		} else if err != nil || got != tc.want {
			t.Errorf("cleanEntryName(%q) = %q, %v", tc.in, got, err)
		}
	}
}
