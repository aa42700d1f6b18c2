package docker_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
)

// TestSessionKeepsTmp: what a command writes to /tmp is kept like the
// workspace: across suspend and resume, and into the session an archive
// is restored into (snapshot → restore, fork), on a volume and on a disk
// (no commas in the names: Podman's bind option syntax splits a source
// path on them).
func TestSessionKeepsTmp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		config   func(c *docker.Config)
		readOnly bool
	}{
		{"read-only rootfs on a volume", func(*docker.Config) {}, true},
		{"read-only rootfs on a disk", func(c *docker.Config) { c.DefaultWorkspaceQuotaMB = 16; c.TmpSizeMB = 16 }, true},
		{"writable rootfs on a volume", func(*docker.Config) {}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			b := newBackend(t, func(c *docker.Config) { c.StateDir = state; tc.config(c) })
			ro := func(s *backends.SandboxSpec) { s.ReadOnlyRootfs = tc.readOnly }
			info := startSession(t, b, ro)
			const files = "/tmp/x /tmp/d/y /workspace/w"
			const want = "tmp\nnested\nws\n"
			mustRun(t, b, info, "echo tmp > /tmp/x && mkdir /tmp/d && echo nested > /tmp/d/y && echo ws > /workspace/w")
			ctx := context.Background()

			if err := b.Suspend(ctx, info); err != nil {
				t.Fatalf("Suspend: %v", err)
			}
			if err := b.Resume(ctx, info); err != nil {
				t.Fatalf("Resume: %v", err)
			}
			if got := mustRun(t, b, info, "cat "+files); got != want {
				t.Errorf("after suspend and resume: %q, want %q", got, want)
			}

			var archive bytes.Buffer
			if err := b.ExportFiles(ctx, info, backends.ExportOptions{}, &archive); err != nil {
				t.Fatalf("ExportFiles: %v", err)
			}
			if names := boxrtEntries(t, archive.Bytes()); len(names) > 0 {
				t.Errorf("the archive holds boxrt's own files: %v", names)
			}
			copyOf := startSession(t, b, ro, func(s *backends.SandboxSpec) { s.SessionID += "-copy" })
			if err := b.ImportFiles(ctx, copyOf, &archive); err != nil {
				t.Fatalf("ImportFiles: %v", err)
			}
			if got := mustRun(t, b, copyOf, "cat "+files); got != want {
				t.Errorf("in the restored copy: %q, want %q", got, want)
			}
			if got := mustRun(t, b, copyOf, "echo more > /tmp/more && stat -c %a /tmp"); got != "1777\n" {
				t.Errorf("the copy's /tmp has mode %q, want 1777", got)
			}
		})
	}
}

// boxrtEntries lists the archive's entries named like boxrt's own files.
func boxrtEntries(t *testing.T, archive []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("reading the archive: %v", err)
		}
		if strings.Contains(hdr.Name, ".boxrt") {
			out = append(out, hdr.Name)
		}
	}
}

// TestPidFilesOutOfUserDirs: the pid files of execs (plain, live,
// interactive) and managed processes are boxrt's, in a directory of its
// own: never in /tmp, the workspace or $HOME, while the command runs or
// after.
func TestPidFilesOutOfUserDirs(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	const userDirs = `/tmp /workspace "$HOME"`
	lookup := `find ` + userDirs + ` -name '.boxrt*' 2>/dev/null; ls -A /run/boxrt`

	// An exec through the session agent has no pid file at all.
	execPidFile := ".boxrt-exec-"
	if usesAgent(t) {
		execPidFile = ""
	}
	plain := mustRun(t, b, info, lookup)
	if !strings.HasPrefix(plain, execPidFile) || strings.Contains(plain, "/") {
		t.Errorf("during a plain exec: %q, want only its pid file in /run/boxrt", plain)
	}
	signals := make(chan syscall.Signal)
	live := runCtx(context.Background(), t, b, info, backends.ExecRequest{Cmd: lookup, Signals: signals, Timeout: 30 * time.Second})
	if live.err != nil || !strings.HasPrefix(live.stdout, execPidFile) || strings.Contains(live.stdout, "/") {
		t.Errorf("during a live exec: %q (err %v), want only its pid file in /run/boxrt", live.stdout, live.err)
	}
	interactive := runCtx(context.Background(), t, b, info, backends.ExecRequest{Cmd: lookup, Stdin: io.NopCloser(strings.NewReader("")), Timeout: 30 * time.Second})
	if interactive.err != nil || strings.Contains(interactive.stdout, "/") {
		t.Errorf("during an interactive exec: %q (err %v)", interactive.stdout, interactive.err)
	}
	p := startPrinted(t, b, info)
	if got := mustRun(t, b, info, lookup); strings.Contains(got, "/") || !strings.Contains(got, ".boxrt-proc-") {
		t.Errorf("beside a managed process: %q, want its pid file in /run/boxrt only", got)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitProcess(t, p)
	waitNoPidFiles(t, b, info, ".boxrt-")
	if got := mustRun(t, b, info, `find `+userDirs+` -name '.boxrt*'`); got != "" {
		t.Errorf("boxrt's files in the user's directories: %q", got)
	}
}

// TestImportLayerTmp: a snapshot of a writable root filesystem made while
// /tmp was part of the layer (rootfs/tmp/…) restores into /tmp, which is
// a mount of its own now.
func TestImportLayerTmp(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b, func(s *backends.SandboxSpec) { s.ReadOnlyRootfs = false })
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	for _, hdr := range []*tar.Header{
		{Name: "rootfs/tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "rootfs/tmp/old", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		// Podman gives the link's inode the link entry's mode.
		{Name: "rootfs/tmp/same", Typeflag: tar.TypeLink, Linkname: "rootfs/tmp/old", Mode: 0o644},
	} {
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			_, _ = tw.Write([]byte("old\n"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.ImportFiles(context.Background(), info, &archive); err != nil {
		t.Fatalf("ImportFiles: %v", err)
	}
	if got := mustRun(t, b, info, "cat /tmp/old /tmp/same"); got != "old\nold\n" {
		t.Errorf("restored /tmp: %q", got)
	}
}

// TestLegacyContainerPidFiles: a container an earlier boxrt made (no /tmp
// mount, no /run/boxrt) keeps its pid files in /tmp once adopted, so that
// its managed processes can still be signalled.
func TestLegacyContainerPidFiles(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	ctx := context.Background()
	cli := rawClient(t)
	c, err := cli.ContainerInspect(ctx, info.BackendSessionID)
	if err != nil {
		t.Fatal(err)
	}
	// A writable rootfs, as such a container had it: /tmp in its layer,
	// and no mounts (the workspace volume is the first session's). Not a
	// copy of the inspected HostConfig: Podman cannot read back its own
	// ulimits.
	init := true
	hc := container.HostConfig{Runtime: c.HostConfig.Runtime, Init: &init, NetworkMode: "none", CapDrop: []string{"ALL"}}
	labels := maps.Clone(c.Config.Labels)
	labels[docker.LabelSession] += "-legacy"
	delete(labels, docker.LabelAgent)
	cfg := *c.Config
	cfg.Labels = labels
	cfg.Entrypoint = []string{"sh", "-c", "while :; do sleep 3600; done"}
	name := info.BackendSessionID + "-legacy"
	if _, err := cli.ContainerCreate(ctx, &cfg, &hc, nil, nil, name); err != nil {
		t.Fatal(err)
	}
	if err := cli.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}

	adopter, err := docker.New(testConfig(t, labels[docker.LabelInstance]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adopter.Close() })
	sessions, err := adopter.Adopt(ctx)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	i := slices.IndexFunc(sessions, func(s backends.Session) bool { return s.BackendSessionID == name })
	if i < 0 {
		t.Fatalf("the legacy container was not adopted: %+v", sessions)
	}
	legacy := sessions[i]
	if got := mustRun(t, adopter, legacy, "ls -A /tmp"); !strings.HasPrefix(got, ".boxrt-exec-") {
		t.Errorf("during an exec, /tmp holds %q, want its pid file", got)
	}
	p := startPrinted(t, adopter, legacy)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := waitProcess(t, p); err != nil || code != -int(syscall.SIGTERM) {
		t.Errorf("after SIGTERM: code %d err %v", code, err)
	}
}

// TestWorkspaceAtTmp: a session whose own mount is /tmp gets no second one
// there (the engine refuses two mounts at one path).
func TestWorkspaceAtTmp(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b, func(s *backends.SandboxSpec) { s.MountPath = "/tmp" })
	if got := mustRun(t, b, info, "echo x > /tmp/y && cat /tmp/y"); got != "x\n" {
		t.Errorf("/tmp: %q", got)
	}
}

// startPrinted starts a managed process that sleeps, once it has written
// its pid file (it prints after that).
func startPrinted(t *testing.T, b *docker.Backend, info backends.Session) backends.Process {
	t.Helper()
	p, _ := startProcess(t, b, info, backends.ProcessSpec{ProcessID: "sleeper", Command: "sh", Args: []string{"-c", "echo up; exec sleep 60"}})
	if line, err := bufio.NewReader(p.Stdout()).ReadString('\n'); err != nil || line != "up\n" {
		t.Fatalf("managed process: %q, %v", line, err)
	}
	return p
}
