package backendtest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// HostileOptions say which parts of an archive a backend restores.
type HostileOptions struct {
	// Rootfs: the backend restores rootfs/ entries (docker); the cases
	// then also aim at the root filesystem and, through it, at a mount.
	Rootfs bool
	// Mounts: sessions can bind host directories (not kube, whose Pods do
	// not run on boxrt's host); the session gets an rw extra mount at
	// /data and a second session a host_path workspace, which no restore
	// may write.
	Mounts bool
}

// entry is one crafted archive entry.
type entry struct {
	hdr  tar.Header
	body string
}

func reg(name, body string, mode int64) entry {
	return entry{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, body}
}

func link(kind byte, name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: kind, Name: name, Linkname: target, Mode: 0o777}}
}

func special(kind byte, name string, major, minor int64) entry {
	return entry{hdr: tar.Header{Typeflag: kind, Name: name, Mode: 0o666, Devmajor: major, Devminor: minor}}
}

// archive is a tar stream of entries.
func archive(t *testing.T, entries []entry) *bytes.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.hdr
		hdr.ModTime = time.Unix(1_700_000_000, 0)
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatalf("crafting %s: %v", hdr.Name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(buf.Bytes())
}

// hostileCases are archives no boxrt export writes: each must be refused
// with BoxSnapshotCorruptedError. host is a host directory (holding
// secret) that no case may change.
func hostileCases(host string, opts HostileOptions) map[string][]entry {
	cases := map[string][]entry{
		"dot-dot name":  {reg("workspace/../../../../../.."+host+"/dotdot", "x", 0o644)},
		"absolute name": {reg(host+"/abs", "x", 0o644), reg("/workspace/abs", "x", 0o644)},
		"file through a symlink": {
			link(tar.TypeSymlink, "workspace/l1", host), reg("workspace/l1/through", "x", 0o644)},
		"directory over a symlink": {
			link(tar.TypeSymlink, "workspace/l2", host), {hdr: tar.Header{Typeflag: tar.TypeDir, Name: "workspace/l2/", Mode: 0o700}}},
		"hard link to a host file":   {link(tar.TypeLink, "workspace/h1", host+"/secret")},
		"hard link out by dot-dot":   {link(tar.TypeLink, "workspace/h2", "workspace/../../../../../.."+host+"/secret")},
		"hard link through symlink":  {link(tar.TypeSymlink, "workspace/l3", host), link(tar.TypeLink, "workspace/h3", "workspace/l3/secret")},
		"character device":           {special(tar.TypeChar, "workspace/mem", 1, 1)},
		"block device":               {special(tar.TypeBlock, "workspace/sda", 8, 0)},
		"fifo":                       {special(tar.TypeFifo, "workspace/fifo", 0, 0)},
		"fifo outside the workspace": {special(tar.TypeFifo, "tmp/fifo", 0, 0)},
	}
	if opts.Rootfs {
		cases["rootfs through a symlink into a mount"] = []entry{
			link(tar.TypeSymlink, "rootfs/tmp/l4", "/data"), reg("rootfs/tmp/l4/through", "x", 0o644)}
		cases["rootfs into a mount"] = []entry{reg("rootfs/data/direct", "x", 0o644)}
		cases["rootfs device"] = []entry{special(tar.TypeChar, "rootfs/tmp/mem", 1, 1)}
	}
	return cases
}

// HostileArchives feeds crafted archives to env.Backend's ImportFiles
// (backends.Archiver): every hostile one is refused with
// BoxSnapshotCorruptedError, setuid and setgid bits are cleared, and no
// host directory (one the cases aim at, the session's mounts) changes.
func HostileArchives(t *testing.T, env Env, opts HostileOptions) {
	a, ok := env.Backend.(backends.Archiver)
	if !ok {
		t.Fatalf("backend %s cannot restore archives", env.Backend.Name())
	}
	host := ReachableDir(t)
	if err := os.WriteFile(filepath.Join(host, "secret"), []byte("host-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := env.Spec("hostile")
	if opts.Rootfs {
		spec.ReadOnlyRootfs = false
	}
	var mnt string
	if opts.Mounts {
		mnt = ReachableDir(t)
		spec.ExtraMounts = append(spec.ExtraMounts, backends.MountSpec{HostPath: mnt, MountPath: "/data", Mode: backends.MountRW})
	}
	info := Start(t, env.Backend, spec)
	unchanged := func(t *testing.T) {
		t.Helper()
		assertTree(t, host, "secret=host-secret:600")
		if mnt != "" {
			assertTree(t, mnt, "")
		}
	}
	for name, entries := range hostileCases(host, opts) {
		t.Run(name, func(t *testing.T) {
			err := a.ImportFiles(context.Background(), info, archive(t, entries))
			if !errors.Is(err, boxerr.ErrSnapshotCorrupted) {
				t.Errorf("restore of %s: want BoxSnapshotCorruptedError, got %v", name, err)
			}
			unchanged(t)
		})
	}
	t.Run("setuid and setgid cleared", func(t *testing.T) {
		err := a.ImportFiles(context.Background(), info, archive(t, []entry{
			{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "workspace/", Mode: 0o777}},
			reg("workspace/suid", "#!/bin/sh\n", 0o4755), reg("workspace/sgid", "#!/bin/sh\n", 0o2755)}))
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		out := run(t, env.Backend, info, "for f in suid sgid; do [ -u /workspace/$f ] || [ -g /workspace/$f ] && echo $f=set-id || echo $f=plain; done")
		if out != "suid=plain\nsgid=plain\n" {
			t.Errorf("restored modes: %q, want no setuid/setgid bit", out)
		}
		unchanged(t)
	})
	if opts.Mounts {
		t.Run("into a host_path workspace", func(t *testing.T) {
			ws := ReachableDir(t)
			spec := env.Spec("hostile-hostpath")
			spec.HostPath, spec.HostPathMode = ws, backends.MountRW
			info := Start(t, env.Backend, spec)
			err := a.ImportFiles(context.Background(), info, archive(t, []entry{reg("workspace/planted", "x", 0o644)}))
			if err != nil && !errors.Is(err, boxerr.ErrSnapshotCorrupted) {
				t.Errorf("restore into a host_path workspace: want success (kept off the host) or BoxSnapshotCorruptedError, got %v", err)
			}
			assertTree(t, ws, "")
		})
	}
}

// assertTree fails unless dir holds exactly the files want describes
// ("name=content:mode" joined by spaces; "" for an empty directory).
func assertTree(t *testing.T, dir, want string) {
	t.Helper()
	var got []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		desc := rel + ":" + fi.Mode().String()
		if fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			desc = fmt.Sprintf("%s=%s:%o", rel, data, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid))
		}
		got = append(got, desc)
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", dir, err)
	}
	if g := strings.Join(got, " "); g != want {
		t.Errorf("host directory %s changed: holds %q, want %q", dir, g, want)
	}
}
