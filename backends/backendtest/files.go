package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

// files is a session of env and its backend's file API.
type files struct {
	env  Env
	fs   runtime.FileSystem
	info backends.Session
}

// Files runs the file API tests every backend serving one must pass: a
// round trip through every kind of mount, offsets, append and mode, listing
// depth, mkdir/rename/remove, a broken upload, typed refusals, symlinks
// planted inside the sandbox that point out of its mounts, and read-only
// mounts. env.Backend must implement runtime.FileSystem; env.FileUID and
// env.FileDirs say what differs between backends.
func Files(t *testing.T, env Env) {
	t.Helper()
	fs, ok := env.Backend.(runtime.FileSystem)
	if !ok {
		t.Fatalf("backend %s does not serve the file API", env.Backend.Name())
	}
	t.Run("round trip", func(t *testing.T) {
		ext := ReachableDir(t)
		spec := env.Spec("files")
		spec.ExtraMounts = append(spec.ExtraMounts, backends.MountSpec{HostPath: ext, MountPath: "/data", Mode: backends.MountRW})
		f := files{env: env, fs: fs, info: Start(t, env.Backend, spec)}
		f.roundTrip(t)
	})
	t.Run("symlink escapes", func(t *testing.T) {
		f := files{env: env, fs: fs, info: Start(t, env.Backend, env.Spec("files-links"))}
		f.symlinkEscapes(t)
	})
	t.Run("read-only mounts", func(t *testing.T) {
		ro := ReachableDir(t)
		if err := os.WriteFile(filepath.Join(ro, "f"), []byte("ro"), 0o644); err != nil {
			t.Fatal(err)
		}
		spec := env.Spec("files-ro")
		spec.HostPath, spec.HostPathMode = ro, backends.MountRO
		spec.ExtraMounts = append(spec.ExtraMounts, backends.MountSpec{HostPath: ro, MountPath: "/ro", Mode: backends.MountRO})
		f := files{env: env, fs: fs, info: Start(t, env.Backend, spec)}
		f.readOnly(t)
	})
}

func (f files) read(p string, off, n int64) ([]byte, error) {
	rc, _, err := f.fs.ReadFile(context.Background(), f.info, p, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func (f files) write(t *testing.T, p string, data []byte, opts backends.WriteOptions) error {
	t.Helper()
	n, err := f.fs.WriteFile(context.Background(), f.info, p, bytes.NewReader(data), opts)
	if err == nil && n != int64(len(data)) {
		t.Fatalf("WriteFile %s wrote %d bytes, want %d", p, n, len(data))
	}
	return err
}

// run runs cmd in the session and returns its stdout, failing the test
// unless it exits 0.
func (f files) run(t *testing.T, cmd string, env map[string]string) string {
	t.Helper()
	return runEnv(t, f.env.Backend, f.info, cmd, env)
}

// run runs cmd in info's session and returns its stdout, failing the test
// unless it exits 0.
func run(t *testing.T, b backends.Backend, info backends.Session, cmd string) string {
	t.Helper()
	return runEnv(t, b, info, cmd, nil)
}

func runEnv(t *testing.T, b backends.Backend, info backends.Session, cmd string, env map[string]string) string {
	t.Helper()
	var out, errOut SyncBuffer
	st, err := b.Exec(context.Background(), info, backends.ExecRequest{
		Cmd: cmd, Env: env, Stdout: &out, Stderr: &errOut, Timeout: 30 * time.Second})
	if err != nil || st.TimedOut || st.ExitCode != 0 {
		t.Fatalf("exec %q: status %+v err %v\nstdout: %s\nstderr: %s", cmd, st, err, out.String(), errOut.String())
	}
	return out.String()
}

// wantField fails unless err is a BoxValidationError naming field.
func wantField(t *testing.T, err error, field string) {
	t.Helper()
	var be *boxerr.Error
	if !errors.As(err, &be) || be.Kind != boxerr.ErrValidation || be.Details["field"] != field {
		t.Fatalf("want a BoxValidationError on %s, got %T %v", field, err, err)
	}
}

// roundTripBinary holds every byte value, three times: the file that
// the round trip writes first and its later steps read.
var roundTripBinary = func() []byte {
	b := make([]byte, 256*3)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// roundTripOddName is a file name with a newline and a non-UTF-8 byte.
const roundTripOddName = "/workspace/n\xffame\nx.txt"

// roundTrip writes files everywhere the session has a mount, then works on
// them step by step: each step reads what the earlier ones left.
func (f files) roundTrip(t *testing.T) {
	f.writeAndReadBack(t)
	for _, step := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"offset and length", f.offsetAndLength},
		{"append and mode", f.appendAndMode},
		{"list depth", f.listDepth},
		{"mkdir rename remove", f.mkdirRenameRemove},
		{"a broken upload leaves the old file", f.brokenUpload},
		{"typed refusals", f.typedRefusals},
	} {
		t.Run(step.name, step.run)
	}
}

// writeAndReadBack writes a file into every kind of mount and reads it
// back, through the file API and inside the sandbox.
func (f files) writeAndReadBack(t *testing.T) {
	cases := []struct {
		name, path string
		data       []byte
	}{
		{"binary with parents", "/workspace/deep/er/a.bin", roundTripBinary},
		{"non-UTF-8 name with a newline", roundTripOddName, []byte("latin1")},
		{"empty file", "/workspace/empty", nil},
		{"tmp", "/tmp/t.txt", []byte("in tmp")},
		{"rw extra mount", "/data/x/e.txt", []byte("extra")},
	}
	for _, d := range f.env.FileDirs {
		cases = append(cases, struct {
			name, path string
			data       []byte
		}{d, d + "/f.txt", []byte("in " + d)})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := f.write(t, tc.path, tc.data, backends.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			got, err := f.read(tc.path, 0, -1)
			if err != nil || !bytes.Equal(got, tc.data) {
				t.Fatalf("read back %q, %v; want %q", got, err, tc.data)
			}
			// The sandbox sees the same bytes, as its own file. The path
			// travels as octal escapes: an exec's environment may have to
			// be valid UTF-8 (docker's is JSON).
			var enc strings.Builder
			for i := 0; i < len(tc.path); i++ {
				fmt.Fprintf(&enc, "\\%03o", tc.path[i])
			}
			out := f.run(t, `P=$(printf "$PE"); stat -c '%u %s %a' "$P"`, map[string]string{"PE": enc.String()})
			if want := fmt.Sprintf("%d %d 644\n", f.env.FileUID, len(tc.data)); out != want {
				t.Fatalf("in the sandbox: %q, want %q", out, want)
			}
		})
	}
}

// offsetAndLength reads ranges of the binary file.
func (f files) offsetAndLength(t *testing.T) {
	for _, rc := range []struct {
		off, n int64
		want   []byte
	}{{0, 10, roundTripBinary[:10]}, {250, 10, roundTripBinary[250:260]}, {760, -1, roundTripBinary[760:]}, {760, 100, roundTripBinary[760:]}, {1000, 5, nil}} {
		got, err := f.read("/workspace/deep/er/a.bin", rc.off, rc.n)
		if err != nil || !bytes.Equal(got, rc.want) {
			t.Fatalf("read(%d, %d) = %v, %v", rc.off, rc.n, got, err)
		}
	}
}

// appendAndMode appends, sets and keeps modes.
func (f files) appendAndMode(t *testing.T) {
	ctx := context.Background()
	p := "/workspace/log.txt"
	for _, part := range []string{"one\n", "two\n"} {
		if err := f.write(t, p, []byte(part), backends.WriteOptions{Append: true, Mode: 0o600}); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := f.read(p, 0, -1)
	fi, err := f.fs.StatFile(ctx, f.info, p)
	if string(got) != "one\ntwo\n" || err != nil || fi.Mode != 0o600 || fi.Type != backends.FileTypeFile || fi.Size != 8 {
		t.Fatalf("appended %q, stat %+v %v", got, fi, err)
	}
	// A replace keeps the mode unless given one.
	if err := f.write(t, p, []byte("x"), backends.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.fs.StatFile(ctx, f.info, p); fi.Mode != 0o600 {
		t.Fatalf("mode after replace %o", fi.Mode)
	}
	if err := f.write(t, "/workspace/run.sh", []byte("#!/bin/sh\necho ran\n"), backends.WriteOptions{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if out := f.run(t, "/workspace/run.sh", nil); out != "ran\n" {
		t.Fatalf("script written with mode 0755 printed %q", out)
	}
}

// listDepth lists the written tree to each depth.
func (f files) listDepth(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		dir   string
		depth int
		want  []string
	}{
		{"/workspace", 1, []string{"/workspace/deep"}},
		{"/workspace/deep/..", 2, []string{"/workspace/deep", "/workspace/deep/er"}},
		{"/workspace", 3, []string{"/workspace/deep", "/workspace/deep/er", "/workspace/deep/er/a.bin"}},
	} {
		entries, err := f.fs.ListFiles(ctx, f.info, tc.dir, tc.depth, 100)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			if strings.HasPrefix(e.Path, "/workspace/deep") {
				got = append(got, e.Path)
			}
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Fatalf("%s depth %d: %v, want %v", tc.dir, tc.depth, got, tc.want)
		}
	}
	entries, err := f.fs.ListFiles(ctx, f.info, "/workspace/deep/er", 1, 100)
	if err != nil || len(entries) != 1 || entries[0].Name != "a.bin" || entries[0].Size != int64(len(roundTripBinary)) ||
		entries[0].Type != backends.FileTypeFile || entries[0].MTime.IsZero() {
		t.Fatalf("entries %+v, %v", entries, err)
	}
	entries, err = f.fs.ListFiles(ctx, f.info, "/workspace", 1, 100)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	if err != nil || !strings.Contains(strings.Join(names, "/"), filepath.Base(roundTripOddName)) {
		t.Fatalf("a name with a newline and a non-UTF-8 byte is missing from %q (%v)", names, err)
	}
}

// mkdirRenameRemove makes, renames and removes a tree.
func (f files) mkdirRenameRemove(t *testing.T) {
	ctx := context.Background()
	if err := f.fs.MakeDir(ctx, f.info, "/workspace/m/n/o"); err != nil {
		t.Fatal(err)
	}
	if err := f.fs.MakeDir(ctx, f.info, "/workspace/m/n/o"); err != nil {
		t.Fatalf("mkdir of an existing directory: %v", err)
	}
	if err := f.write(t, "/workspace/m/n/o/f", []byte("f"), backends.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.fs.RenameFile(ctx, f.info, "/workspace/m/n", "/workspace/m/renamed"); err != nil {
		t.Fatal(err)
	}
	if got, err := f.read("/workspace/m/renamed/o/f", 0, -1); err != nil || string(got) != "f" {
		t.Fatalf("after rename: %q %v", got, err)
	}
	wantField(t, f.fs.RemoveFile(ctx, f.info, "/workspace/m", false), "path")
	if err := f.fs.RemoveFile(ctx, f.info, "/workspace/m", true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.fs.StatFile(ctx, f.info, "/workspace/m"); !errors.Is(err, boxerr.ErrFileNotFound) {
		t.Fatalf("stat after remove: %v", err)
	}
	if out := f.run(t, "ls -a /workspace/", nil); strings.Contains(out, "boxrt-upload") || strings.Contains(out, "\nm\n") {
		t.Fatalf("workspace after remove: %q", out)
	}
}

// brokenUpload checks that a write whose source fails leaves the old file.
func (f files) brokenUpload(t *testing.T) {
	ctx := context.Background()
	p := "/workspace/keep.txt"
	if err := f.write(t, p, []byte("old"), backends.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	broken := io.MultiReader(bytes.NewReader(make([]byte, 100000)), iotest.ErrReader(errors.New("client went away")))
	if _, err := f.fs.WriteFile(ctx, f.info, p, broken, backends.WriteOptions{}); err == nil {
		t.Fatal("a write whose source failed succeeded")
	}
	if got, err := f.read(p, 0, -1); err != nil || string(got) != "old" {
		t.Fatalf("after a broken upload: %q %v", got, err)
	}
	if out := f.run(t, "ls -a /workspace", nil); strings.Contains(out, "boxrt-upload") {
		t.Fatalf("a temporary file was left: %q", out)
	}
}

// typedRefusals checks the typed errors of calls the file API refuses.
func (f files) typedRefusals(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  func() error
		kind *boxerr.Kind
	}{
		{"read missing", func() error { _, err := f.read("/workspace/nope", 0, -1); return err }, boxerr.ErrFileNotFound},
		{"stat missing", func() error { _, err := f.fs.StatFile(ctx, f.info, "/workspace/a/b/c"); return err }, boxerr.ErrFileNotFound},
		{"remove mount point", func() error { return f.fs.RemoveFile(ctx, f.info, "/workspace", true) }, boxerr.ErrValidation},
		{"rename across mounts", func() error { return f.fs.RenameFile(ctx, f.info, "/workspace/log.txt", "/tmp/log.txt") }, boxerr.ErrValidation},
		{"read a directory", func() error { _, err := f.read("/workspace/deep", 0, -1); return err }, boxerr.ErrValidation},
		{"write over a directory", func() error { return f.write(t, "/workspace/deep", []byte("x"), backends.WriteOptions{}) }, boxerr.ErrValidation},
		{"system view /etc", func() error { return f.write(t, "/etc/evil", []byte("x"), backends.WriteOptions{}) }, boxerr.ErrValidation},
		{"system view /usr/bin", func() error { return f.write(t, "/usr/bin/evil", []byte("x"), backends.WriteOptions{}) }, boxerr.ErrValidation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.err(); !errors.Is(err, tc.kind) {
				t.Errorf("want %s, got %v", tc.kind.Type, err)
			}
		})
	}
}

// symlinkEscapes plants links inside the sandbox, as sandboxed code
// would, and checks that no file API call reaches out of the mounts
// through them.
func (f files) symlinkEscapes(t *testing.T) {
	ctx := context.Background()
	f.run(t, `cd /workspace && echo inside > a.txt && mkdir real &&
		ln -s /etc/passwd abs && ln -s ../../../../../../etc/passwd rel && ln -s /proc/1/root proc &&
		ln -s /etc etcdir && ln -s .. up && ln -s /workspace/a.txt inside && ln -s ../tmp tmpdir && ln -s loop loop && mkfifo fifo`, nil)
	marker := "boxrt-files-escape-" + strconv.Itoa(os.Getpid())
	for _, tc := range []struct{ name, path string }{
		{"absolute link", "/workspace/abs"},
		{"relative dot-dot link", "/workspace/rel"},
		{"proc root", "/workspace/proc/etc/passwd"},
		{"symlinked parent", "/workspace/etcdir/passwd"},
		{"link to the parent of the mount", "/workspace/up/etc/passwd"},
		{"outside the mounts", "/etc/passwd"},
		{"proc directly", "/proc/self/environ"},
		{"a link loop", "/workspace/loop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.read(tc.path, 0, -1)
			wantField(t, err, "path")
			wantField(t, f.write(t, tc.path, []byte("x"), backends.WriteOptions{}), "path")
			if _, err := f.fs.ListFiles(ctx, f.info, tc.path, 1, 10); err == nil {
				t.Fatal("list through the link succeeded")
			}
		})
	}
	t.Run("nothing lands through a symlinked parent", func(t *testing.T) {
		wantField(t, f.write(t, "/workspace/etcdir/"+marker, []byte("x"), backends.WriteOptions{}), "path")
		wantField(t, f.fs.MakeDir(ctx, f.info, "/workspace/etcdir/"+marker), "path")
		wantField(t, f.fs.RenameFile(ctx, f.info, "/workspace/a.txt", "/workspace/etcdir/"+marker), "to")
		// Neither in the sandbox's /etc nor, where that is the host's, in
		// the host's.
		if out := f.run(t, "ls -a /etc", nil); strings.Contains(out, marker) {
			t.Fatalf("/etc/%s was created in the sandbox", marker)
		}
		if _, err := os.Lstat("/etc/" + marker); err == nil {
			t.Fatalf("/etc/%s was created on the host", marker)
		}
	})
	t.Run("links inside the mounts resolve as in the sandbox", func(t *testing.T) {
		if got, err := f.read("/workspace/inside", 0, -1); err != nil || string(got) != "inside\n" {
			t.Fatalf("absolute link inside the workspace: %q %v", got, err)
		}
		if err := f.write(t, "/workspace/tmpdir/via-link", []byte("t"), backends.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		if out := f.run(t, "cat /tmp/via-link", nil); out != "t" {
			t.Fatalf("a write through ../tmp landed elsewhere: %q", out)
		}
		fi, err := f.fs.StatFile(ctx, f.info, "/workspace/abs")
		if err != nil || fi.Type != backends.FileTypeSymlink {
			t.Fatalf("stat of the link itself: %+v %v", fi, err)
		}
		// Removing the link removes the link, not its target.
		if err := f.fs.RemoveFile(ctx, f.info, "/workspace/etcdir", false); err != nil {
			t.Fatal(err)
		}
		if out := f.run(t, "ls /etc/passwd", nil); out != "/etc/passwd\n" {
			t.Fatalf("/etc suffered from removing a link to it: %q", out)
		}
	})
	t.Run("a FIFO does not hang a read", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := f.read("/workspace/fifo", 0, -1); done <- err }()
		select {
		case err := <-done:
			wantField(t, err, "path")
		case <-time.After(5 * time.Second):
			t.Fatal("reading a FIFO hangs")
		}
	})
}

// readOnly checks a session whose workspace and /ro are read-only host
// directories: writes, removals and mkdirs are refused as read_only,
// reads work.
func (f files) readOnly(t *testing.T) {
	ctx := context.Background()
	for _, p := range []string{"/workspace/new", "/workspace/f", "/ro/new", "/ro/f"} {
		t.Run(p, func(t *testing.T) {
			err := f.write(t, p, []byte("x"), backends.WriteOptions{})
			wantField(t, err, "path")
			var be *boxerr.Error
			if errors.As(err, &be); be.Details["reason"] != "read_only" {
				t.Fatalf("want reason read_only, got %v", err)
			}
			wantField(t, f.fs.RemoveFile(ctx, f.info, p, false), "path")
			wantField(t, f.fs.MakeDir(ctx, f.info, p+"dir"), "path")
		})
	}
	for _, p := range []string{"/workspace/f", "/ro/f"} {
		if got, err := f.read(p, 0, -1); err != nil || string(got) != "ro" {
			t.Fatalf("read %s from a read-only mount: %q %v", p, got, err)
		}
	}
}

// ReachableDir is a t.TempDir the sandbox's user may write, as an operator
// prepares an rw host path (the sandbox is not host root).
func ReachableDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Dir(dir), 0o711}, {dir, 0o777}} {
		if err := os.Chmod(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
