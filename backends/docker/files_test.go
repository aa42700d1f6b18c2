package docker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

func readAll(t *testing.T, b *docker.Backend, info backends.Session, p string, off, n int64) ([]byte, error) {
	t.Helper()
	rc, _, err := b.ReadFile(context.Background(), info, p, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func write(t *testing.T, b *docker.Backend, info backends.Session, p string, data []byte, opts backends.WriteOptions) error {
	t.Helper()
	n, err := b.WriteFile(context.Background(), info, p, bytes.NewReader(data), opts)
	if err == nil && n != int64(len(data)) {
		t.Fatalf("WriteFile %s wrote %d bytes, want %d", p, n, len(data))
	}
	return err
}

func wantField(t *testing.T, err error, field string) {
	t.Helper()
	var be *boxerr.Error
	if !errors.As(err, &be) || be.Kind != boxerr.ErrValidation || be.Details["field"] != field {
		t.Fatalf("want a BoxValidationError on %s, got %T %v", field, err, err)
	}
}

func TestFilesRoundTrip(t *testing.T) {
	b := newBackend(t)
	ext := t.TempDir()
	if err := os.Chmod(ext, 0o777); err != nil {
		t.Fatal(err)
	}
	info := startSession(t, b, func(s *backends.SandboxSpec) {
		s.ExtraMounts = []backends.MountSpec{{HostPath: ext, MountPath: "/data", Mode: backends.MountRW}}
	})
	ctx := context.Background()
	binary := make([]byte, 256*3)
	for i := range binary {
		binary[i] = byte(i)
	}
	for _, tc := range []struct {
		name, path string
		data       []byte
	}{
		{"binary with parents", "/workspace/deep/er/a.bin", binary},
		{"non-UTF-8 name", "/workspace/n\xffame\nx.txt", []byte("latin1")},
		{"empty file", "/workspace/empty", nil},
		{"tmpfs", "/tmp/t.txt", []byte("in tmp")},
		{"rw extra mount", "/data/x/e.txt", []byte("extra")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := write(t, b, info, tc.path, tc.data, backends.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			got, err := readAll(t, b, info, tc.path, 0, -1)
			if err != nil || !bytes.Equal(got, tc.data) {
				t.Fatalf("read back %q, %v; want %q", got, err, tc.data)
			}
			// The path travels as octal escapes: exec env is JSON too.
			var enc strings.Builder
			for i := 0; i < len(tc.path); i++ {
				fmt.Fprintf(&enc, "\\%03o", tc.path[i])
			}
			r := runCtx(ctx, t, b, info, backends.ExecRequest{Cmd: `P=$(printf "$PE"); stat -c '%u %s %a' "$P"`,
				Env: map[string]string{"PE": enc.String()}, Timeout: 30 * time.Second})
			if want := "1000 " + strconv.Itoa(len(tc.data)) + " 644\n"; r.stdout != want {
				t.Fatalf("in the container: %q (stderr %q), want %q", r.stdout, r.stderr, want)
			}
		})
	}
	t.Run("offset and length", func(t *testing.T) {
		for _, rc := range []struct {
			off, n int64
			want   []byte
		}{{0, 10, binary[:10]}, {250, 10, binary[250:260]}, {760, -1, binary[760:]}, {760, 100, binary[760:]}, {1000, 5, nil}} {
			got, err := readAll(t, b, info, "/workspace/deep/er/a.bin", rc.off, rc.n)
			if err != nil || !bytes.Equal(got, rc.want) {
				t.Fatalf("read(%d, %d) = %v, %v", rc.off, rc.n, got, err)
			}
		}
	})
	t.Run("append and mode", func(t *testing.T) {
		p := "/workspace/log.txt"
		for _, part := range []string{"one\n", "two\n"} {
			if err := write(t, b, info, p, []byte(part), backends.WriteOptions{Append: true, Mode: 0o600}); err != nil {
				t.Fatal(err)
			}
		}
		got, _ := readAll(t, b, info, p, 0, -1)
		fi, err := b.StatFile(ctx, info, p)
		if string(got) != "one\ntwo\n" || err != nil || fi.Mode != 0o600 || fi.Type != backends.FileTypeFile || fi.Size != 8 {
			t.Fatalf("appended %q, stat %+v %v", got, fi, err)
		}
		if err := write(t, b, info, p, []byte("x"), backends.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		if fi, _ := b.StatFile(ctx, info, p); fi.Mode != 0o600 {
			t.Fatalf("mode after replace %o", fi.Mode)
		}
	})
	t.Run("list depth", func(t *testing.T) {
		for _, tc := range []struct {
			depth int
			want  []string
		}{
			{1, []string{"/workspace/deep"}},
			{3, []string{"/workspace/deep", "/workspace/deep/er", "/workspace/deep/er/a.bin"}},
		} {
			entries, err := b.ListFiles(ctx, info, "/workspace", tc.depth, 100)
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
				t.Fatalf("depth %d: %v, want %v", tc.depth, got, tc.want)
			}
		}
		entries, err := b.ListFiles(ctx, info, "/workspace/deep/er", 1, 100)
		if err != nil || len(entries) != 1 || entries[0].Name != "a.bin" || entries[0].Size != int64(len(binary)) ||
			entries[0].Type != backends.FileTypeFile || entries[0].MTime.IsZero() {
			t.Fatalf("entries %+v, %v", entries, err)
		}
		entries, err = b.ListFiles(ctx, info, "/workspace", 1, 100)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name)
		}
		if err != nil || !strings.Contains(strings.Join(names, "/"), "n\xffame\nx.txt") {
			t.Fatalf("a name with a newline and a non-UTF-8 byte is missing from %q (%v)", names, err)
		}
	})
	t.Run("mkdir rename remove", func(t *testing.T) {
		if err := b.MakeDir(ctx, info, "/workspace/m/n/o"); err != nil {
			t.Fatal(err)
		}
		if err := write(t, b, info, "/workspace/m/n/o/f", []byte("f"), backends.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := b.RenameFile(ctx, info, "/workspace/m/n", "/workspace/m/renamed"); err != nil {
			t.Fatal(err)
		}
		if got, err := readAll(t, b, info, "/workspace/m/renamed/o/f", 0, -1); err != nil || string(got) != "f" {
			t.Fatalf("after rename: %q %v", got, err)
		}
		wantField(t, b.RemoveFile(ctx, info, "/workspace/m", false), "path")
		if err := b.RemoveFile(ctx, info, "/workspace/m", true); err != nil {
			t.Fatal(err)
		}
		if _, err := b.StatFile(ctx, info, "/workspace/m"); !errors.Is(err, boxerr.ErrFileNotFound) {
			t.Fatalf("stat after remove: %v", err)
		}
		if out := mustRun(t, b, info, "ls -a /workspace/"); strings.Contains(out, "boxrt-upload") {
			t.Fatalf("workspace after remove: %q", out)
		}
	})
	t.Run("a broken upload leaves the old file", func(t *testing.T) {
		p := "/workspace/keep.txt"
		if err := write(t, b, info, p, []byte("old"), backends.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		broken := io.MultiReader(bytes.NewReader(make([]byte, 100000)), iotest.ErrReader(errors.New("client went away")))
		if _, err := b.WriteFile(ctx, info, p, broken, backends.WriteOptions{}); err == nil {
			t.Fatal("a write whose source failed succeeded")
		}
		if got, err := readAll(t, b, info, p, 0, -1); err != nil || string(got) != "old" {
			t.Fatalf("after a broken upload: %q %v", got, err)
		}
		if out := mustRun(t, b, info, "ls -a /workspace"); strings.Contains(out, "boxrt-upload") {
			t.Fatalf("a temporary file was left: %q", out)
		}
	})
	t.Run("typed refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			err  error
			kind *boxerr.Kind
		}{
			{"read missing", func() error { _, err := readAll(t, b, info, "/workspace/nope", 0, -1); return err }(), boxerr.ErrFileNotFound},
			{"stat missing", func() error { _, err := b.StatFile(ctx, info, "/workspace/a/b/c"); return err }(), boxerr.ErrFileNotFound},
			{"remove mount point", b.RemoveFile(ctx, info, "/workspace", true), boxerr.ErrValidation},
			{"rename across mounts", b.RenameFile(ctx, info, "/workspace/log.txt", "/tmp/log.txt"), boxerr.ErrValidation},
			{"read a directory", func() error { _, err := readAll(t, b, info, "/workspace/deep", 0, -1); return err }(), boxerr.ErrValidation},
			{"write over a directory", write(t, b, info, "/workspace/deep", []byte("x"), backends.WriteOptions{}), boxerr.ErrValidation},
			{"read-only rootfs", write(t, b, info, "/etc/evil", []byte("x"), backends.WriteOptions{}), boxerr.ErrValidation},
		} {
			if !errors.Is(tc.err, tc.kind) {
				t.Errorf("%s: want %s, got %v", tc.name, tc.kind.Type, tc.err)
			}
		}
	})
}

func TestFilesSymlinkEscapes(t *testing.T) {
	b := newBackend(t)
	info := startSession(t, b)
	ctx := context.Background()
	mustRun(t, b, info, `cd /workspace && echo inside > a.txt &&
		ln -s /etc/passwd abs && ln -s ../../../../../../etc/passwd rel && ln -s /proc/1/root proc &&
		ln -s /etc etcdir && ln -s .. up && ln -s /workspace/a.txt inside && ln -s ../tmp tmpdir && ln -s loop loop && mkfifo fifo`)
	for _, tc := range []struct{ name, path string }{
		{"absolute link", "/workspace/abs"},
		{"relative dot-dot link", "/workspace/rel"},
		{"proc root", "/workspace/proc/etc/passwd"},
		{"symlinked parent", "/workspace/etcdir/passwd"},
		{"link to the parent of the mount", "/workspace/up/etc/passwd"},
		{"outside the mounts", "/etc/passwd"},
		{"a link loop", "/workspace/loop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readAll(t, b, info, tc.path, 0, -1)
			wantField(t, err, "path")
			wantField(t, write(t, b, info, tc.path, []byte("x"), backends.WriteOptions{}), "path")
		})
	}
	t.Run("rename into a symlinked parent", func(t *testing.T) {
		wantField(t, b.RenameFile(ctx, info, "/workspace/a.txt", "/workspace/etcdir/x"), "to")
	})
	t.Run("links inside the mounts resolve as in the sandbox", func(t *testing.T) {
		if got, err := readAll(t, b, info, "/workspace/inside", 0, -1); err != nil || string(got) != "inside\n" {
			t.Fatalf("absolute link inside the workspace: %q %v", got, err)
		}
		if err := write(t, b, info, "/workspace/tmpdir/via-link", []byte("t"), backends.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		if out := mustRun(t, b, info, "cat /tmp/via-link"); out != "t" {
			t.Fatalf("a write through ../tmp landed elsewhere: %q", out)
		}
		if fi, err := b.StatFile(ctx, info, "/workspace/abs"); err != nil || fi.Type != backends.FileTypeSymlink {
			t.Fatalf("stat of the link itself: %+v %v", fi, err)
		}
	})
	t.Run("a FIFO does not hang a read", func(t *testing.T) {
		_, err := readAll(t, b, info, "/workspace/fifo", 0, -1)
		wantField(t, err, "path")
	})
}

func TestFilesReadOnlyMounts(t *testing.T) {
	b := newBackend(t)
	ro := t.TempDir()
	if err := os.WriteFile(ro+"/f", []byte("ro"), 0o644); err != nil {
		t.Fatal(err)
	}
	info := startSession(t, b, func(s *backends.SandboxSpec) {
		s.ExtraMounts = []backends.MountSpec{{HostPath: ro, MountPath: "/ro", Mode: backends.MountRO}}
	})
	for _, p := range []string{"/ro/new", "/ro/f"} {
		err := write(t, b, info, p, []byte("x"), backends.WriteOptions{})
		wantField(t, err, "path")
		var be *boxerr.Error
		if errors.As(err, &be); be.Details["reason"] != "read_only" {
			t.Fatalf("%s: want reason read_only, got %v", p, err)
		}
	}
	if got, err := readAll(t, b, info, "/ro/f", 0, -1); err != nil || string(got) != "ro" {
		t.Fatalf("read from a ro mount: %q %v", got, err)
	}
}
