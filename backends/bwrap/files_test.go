package bwrap

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

func readAll(t *testing.T, b *Backend, info backends.Session, p string, off, n int64) ([]byte, error) {
	t.Helper()
	rc, _, err := b.ReadFile(context.Background(), info, p, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func write(t *testing.T, b *Backend, info backends.Session, p string, data []byte, opts backends.WriteOptions) error {
	t.Helper()
	n, err := b.WriteFile(context.Background(), info, p, bytes.NewReader(data), opts)
	if err == nil && n != int64(len(data)) {
		t.Fatalf("WriteFile %s wrote %d bytes, want %d", p, n, len(data))
	}
	return err
}

// wantField fails unless err is a BoxValidationError naming field.
func wantField(t *testing.T, err error, field string) {
	t.Helper()
	var be *boxerr.Error
	if !errors.As(err, &be) || be.Kind != boxerr.ErrValidation || be.Details["field"] != field {
		t.Fatalf("want a BoxValidationError on %s, got %T %v", field, err, err)
	}
}

func TestFilesRoundTrip(t *testing.T) {
	b := newBackend(t)
	ext := reachableDir(t)
	info := newSession(t, b, func(s *backends.SandboxSpec) {
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
		{"non-UTF-8 name", "/workspace/n\xffame\x01.txt", []byte("latin1")},
		{"empty file", "/workspace/empty", nil},
		{"tmp", "/tmp/t.txt", []byte("in tmp")},
		{"home", "/home/h.txt", []byte("in home")},
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
			// The sandbox sees the same bytes, as its own file.
			r := execIn(t, b, info, backends.ExecRequest{Cmd: `stat -c '%u %s %a' "$P"`, Env: map[string]string{"P": tc.path}})
			want := "0 " + strconv.Itoa(len(tc.data)) + " 644\n"
			if r.stdout != want {
				t.Fatalf("in the sandbox: %q (stderr %q), want %q", r.stdout, r.stderr, want)
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
		// A replace keeps the mode unless given one.
		if err := write(t, b, info, p, []byte("x"), backends.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		if fi, _ := b.StatFile(ctx, info, p); fi.Mode != 0o600 {
			t.Fatalf("mode after replace %o", fi.Mode)
		}
		if err := write(t, b, info, "/workspace/run.sh", []byte("#!/bin/sh\necho ran\n"), backends.WriteOptions{Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
		if out := mustRun(t, b, info, "/workspace/run.sh"); out != "ran\n" {
			t.Fatalf("script wrote with mode 0755 printed %q", out)
		}
	})
	t.Run("list depth", func(t *testing.T) {
		for _, tc := range []struct {
			depth int
			want  []string
		}{
			{1, []string{"/workspace/deep"}},
			{2, []string{"/workspace/deep", "/workspace/deep/er"}},
			{3, []string{"/workspace/deep", "/workspace/deep/er", "/workspace/deep/er/a.bin"}},
		} {
			entries, err := b.ListFiles(ctx, info, "/workspace/deep/..", tc.depth, 100)
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
	})
	t.Run("mkdir rename remove", func(t *testing.T) {
		if err := b.MakeDir(ctx, info, "/workspace/m/n/o"); err != nil {
			t.Fatal(err)
		}
		if err := b.MakeDir(ctx, info, "/workspace/m/n/o"); err != nil {
			t.Fatalf("mkdir of an existing directory: %v", err)
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
		if out := mustRun(t, b, info, "ls -a /workspace/"); strings.Contains(out, "boxrt-upload") || strings.Contains(out, "\nm\n") {
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
			{"system view", write(t, b, info, "/usr/bin/evil", []byte("x"), backends.WriteOptions{}), boxerr.ErrValidation},
		} {
			if !errors.Is(tc.err, tc.kind) {
				t.Errorf("%s: want %s, got %v", tc.name, tc.kind.Type, tc.err)
			}
		}
	})
}

// TestFilesSymlinkEscapes plants links inside the sandbox, as sandboxed
// code would, and checks that no file API call reaches the host through
// them.
func TestFilesSymlinkEscapes(t *testing.T) {
	b := newBackend(t)
	info := newSession(t, b, nil)
	ctx := context.Background()
	mustRun(t, b, info, `cd /workspace && echo inside > a.txt && mkdir real &&
		ln -s /etc/shadow abs && ln -s ../../../../../../etc/shadow rel && ln -s /proc/1/root proc &&
		ln -s /etc etcdir && ln -s .. up && ln -s /workspace/a.txt inside && ln -s ../tmp tmpdir &&
		ln -s loop1 loop2 && ln -s loop2 loop1 && mkfifo fifo`)
	marker := "boxrt-files-escape-" + strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name, path string
	}{
		{"absolute link", "/workspace/abs"},
		{"relative dot-dot link", "/workspace/rel"},
		{"proc root", "/workspace/proc/etc/shadow"},
		{"symlinked parent", "/workspace/etcdir/shadow"},
		{"link to the parent of the mount", "/workspace/up/etc/shadow"},
		{"outside the mounts", "/etc/shadow"},
		{"proc directly", "/proc/self/environ"},
		{"link loop", "/workspace/loop1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readAll(t, b, info, tc.path, 0, -1)
			wantField(t, err, "path")
			wantField(t, write(t, b, info, tc.path, []byte("x"), backends.WriteOptions{}), "path")
			if _, err := b.ListFiles(ctx, info, tc.path, 1, 10); err == nil {
				t.Fatal("list through the link succeeded")
			}
		})
	}
	t.Run("write through a symlinked parent stays out of the host", func(t *testing.T) {
		wantField(t, write(t, b, info, "/workspace/etcdir/"+marker, []byte("x"), backends.WriteOptions{}), "path")
		wantField(t, b.MakeDir(ctx, info, "/workspace/etcdir/"+marker), "path")
		wantField(t, b.RenameFile(ctx, info, "/workspace/a.txt", "/workspace/etcdir/"+marker), "to")
		if _, err := os.Lstat("/etc/" + marker); err == nil {
			t.Fatalf("/etc/%s was created on the host", marker)
		}
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
		fi, err := b.StatFile(ctx, info, "/workspace/abs")
		if err != nil || fi.Type != backends.FileTypeSymlink {
			t.Fatalf("stat of the link itself: %+v %v", fi, err)
		}
		// Removing the link removes the link, not its target.
		if err := b.RemoveFile(ctx, info, "/workspace/etcdir", false); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat("/etc/passwd"); err != nil {
			t.Fatal("the host's /etc suffered from removing a link to it")
		}
	})
	t.Run("a FIFO does not hang a read", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := readAll(t, b, info, "/workspace/fifo", 0, -1); done <- err }()
		select {
		case err := <-done:
			wantField(t, err, "path")
		case <-time.After(5 * time.Second):
			t.Fatal("reading a FIFO hangs")
		}
	})
}

// TestFilesSymlinkRace swaps a directory for a symlink to the host's /etc
// (on the host, as fast as it can) while files are written below it: no
// write may ever land in /etc.
func TestFilesSymlinkRace(t *testing.T) {
	b := newBackend(t)
	info := newSession(t, b, nil)
	ws := workspaceOnHost(b, info)
	marker := "boxrt-race-" + strconv.Itoa(os.Getpid())
	d := filepath.Join(ws, "d")
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			_ = os.Rename(d, d+".real")
			_ = os.Symlink("/etc", d)
			_ = os.Remove(d)
			_ = os.Rename(d+".real", d)
		}
	}()
	var ok, refused int
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		err := write(t, b, info, "/workspace/d/"+marker, []byte("x"), backends.WriteOptions{})
		switch {
		case err == nil:
			ok++
		case errors.Is(err, boxerr.ErrValidation), errors.Is(err, boxerr.ErrFileNotFound):
			refused++
		default:
			t.Errorf("untyped failure: %v", err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if _, err := os.Lstat("/etc/" + marker); err == nil {
		os.Remove("/etc/" + marker)
		t.Fatalf("a write reached the host's /etc through a swapped symlink")
	}
	t.Logf("%d writes landed in the workspace, %d refused while the link was in place", ok, refused)
}

func TestFilesReadOnlyMounts(t *testing.T) {
	b := newBackend(t)
	ro, rw := reachableDir(t), reachableDir(t)
	if err := os.WriteFile(filepath.Join(ro, "f"), []byte("ro"), 0o644); err != nil {
		t.Fatal(err)
	}
	info := newSession(t, b, func(s *backends.SandboxSpec) {
		s.HostPath, s.HostPathMode = ro, backends.MountRO
		s.ExtraMounts = []backends.MountSpec{
			{HostPath: ro, MountPath: "/ro", Mode: backends.MountRO},
			{HostPath: rw, MountPath: "/rw", Mode: backends.MountRW},
		}
	})
	ctx := context.Background()
	for _, p := range []string{"/workspace/new", "/workspace/f", "/ro/f"} {
		err := write(t, b, info, p, []byte("x"), backends.WriteOptions{})
		wantField(t, err, "path")
		var be *boxerr.Error
		if errors.As(err, &be); be.Details["reason"] != "read_only" {
			t.Fatalf("%s: want reason read_only, got %v", p, err)
		}
		wantField(t, b.RemoveFile(ctx, info, p, false), "path")
		wantField(t, b.MakeDir(ctx, info, p+"dir"), "path")
	}
	if got, err := readAll(t, b, info, "/ro/f", 0, -1); err != nil || string(got) != "ro" {
		t.Fatalf("read from a ro mount: %q %v", got, err)
	}
	// An rw mount is writable, and what lands on
	// the host belongs to the host directory's owner (the idmapped clone).
	if err := write(t, b, info, "/rw/w", []byte("w"), backends.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	var want int
	if fi, err := os.Stat(rw); err == nil {
		want = int(fi.Sys().(*syscall.Stat_t).Uid)
	}
	fi, err := os.Stat(filepath.Join(rw, "w"))
	if err != nil || int(fi.Sys().(*syscall.Stat_t).Uid) != want {
		t.Fatalf("host file of an rw mount: %v, owner %v want %d", err, fi, want)
	}
}
