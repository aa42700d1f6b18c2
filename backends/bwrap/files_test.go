package bwrap

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// TestFiles runs the file API tests every backend shares.
func TestFiles(t *testing.T) {
	backendtest.Files(t, conformanceEnv(t))
}

// TestFilesLinkLoop: a path through a symlink loop is a refusal naming
// the path. (docker's in-container resolver reports it as a failure of
// its own, not yet a validation error: not in backendtest.Files.)
func TestFilesLinkLoop(t *testing.T) {
	b := newBackend(t)
	info := newSession(t, b, nil)
	mustRun(t, b, info, "cd /workspace && ln -s loop1 loop2 && ln -s loop2 loop1")
	for _, tc := range []struct {
		name string
		err  func() error
	}{
		{"read", func() error {
			_, _, err := b.ReadFile(context.Background(), info, "/workspace/loop1", 0, -1)
			return err
		}},
		{"write", func() error { return apiWrite(b, info, "/workspace/loop1", []byte("x")) }},
		{"list", func() error { _, err := b.ListFiles(context.Background(), info, "/workspace/loop1", 1, 10); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var be *boxerr.Error
			if err := tc.err(); !errors.As(err, &be) || be.Kind != boxerr.ErrValidation || be.Details["field"] != "path" {
				t.Fatalf("want a BoxValidationError on path, got %T %v", err, err)
			}
		})
	}
}

// apiWrite writes data to p through the file API.
func apiWrite(b *Backend, info backends.Session, p string, data []byte) error {
	_, err := b.WriteFile(context.Background(), info, p, bytes.NewReader(data), backends.WriteOptions{})
	return err
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
		err := apiWrite(b, info, "/workspace/d/"+marker, []byte("x"))
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

// TestFilesRWMountOwner: what the file API writes to an rw mount belongs,
// on the host, to the host directory's owner (the idmapped clone).
func TestFilesRWMountOwner(t *testing.T) {
	b := newBackend(t)
	rw := backendtest.ReachableDir(t)
	info := newSession(t, b, func(s *backends.SandboxSpec) {
		s.ExtraMounts = []backends.MountSpec{{HostPath: rw, MountPath: "/rw", Mode: backends.MountRW}}
	})
	if err := apiWrite(b, info, "/rw/w", []byte("w")); err != nil {
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

// TestFileAPIKeepsOtherSandboxesAlive: the file API's sandbox-user
// threads come from Go's pool, and a bwrap forked from a thread carries
// Pdeathsig tied to that thread; a file call that ended its thread killed
// whatever the thread had forked (a command of any session died with
// 137). A process started right before file calls must survive them.
func TestFileAPIKeepsOtherSandboxesAlive(t *testing.T) {
	b := newBackend(t)
	info := newSession(t, b, nil)
	for i := range 8 {
		p, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{ProcessID: "cat" + strconv.Itoa(i), Command: "cat"})
		if err != nil {
			t.Fatal(err)
		}
		for j := range 5 {
			if err := apiWrite(b, info, "/workspace/f"+strconv.Itoa(j), []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		line := "alive " + strconv.Itoa(i) + "\n"
		if _, err := io.WriteString(p.Stdin(), line); err != nil {
			t.Fatalf("process %d: stdin: %v", i, err)
		}
		buf := make([]byte, len(line))
		if _, err := io.ReadFull(p.Stdout(), buf); err != nil || string(buf) != line {
			t.Fatalf("process %d died under the file API: read %q, %v", i, buf, err)
		}
		_ = p.Stdin().Close()
		if code, err := waitWithin(t, p, 5*time.Second); err != nil || code != 0 {
			t.Fatalf("process %d: exit %d, %v (want 0 after its stdin closed)", i, code, err)
		}
	}
}
