package kube_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/kube"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// outside is in the message of a refused path outside the mounts.
const outside = "outside the sandbox's mounts"

func readAll(b *kube.Backend, info backends.Session, p string, off, n int64) ([]byte, error) {
	rc, _, err := b.ReadFile(context.Background(), info, p, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func write(t *testing.T, b *kube.Backend, info backends.Session, p string, data []byte, opts backends.WriteOptions) error {
	t.Helper()
	n, err := b.WriteFile(context.Background(), info, p, bytes.NewReader(data), opts)
	if err == nil && n != int64(len(data)) {
		t.Fatalf("WriteFile %s wrote %d bytes, want %d", p, n, len(data))
	}
	return err
}

// wantRefused checks err is a BoxValidationError on field and, unless
// why is "", that why is its reason or in its message.
func wantRefused(t *testing.T, err error, field, why string) {
	t.Helper()
	var be *boxerr.Error
	if !errors.As(err, &be) || be.Kind != boxerr.ErrValidation || be.Details["field"] != field {
		t.Fatalf("want a BoxValidationError on %s, got %T %v", field, err, err)
	}
	if why != "" && be.Details["reason"] != why && !strings.Contains(be.Error(), why) {
		t.Fatalf("want %q, got %v", why, err)
	}
}

// TestFiles: the file API (sandboxfs, as on docker) through the Pod exec
// subresource, in the Pod's own view of its files.
func TestFiles(t *testing.T) {
	b := newBackend(t, "")
	info := start(t, b, spec("files-"+randomID()))
	ctx := context.Background()
	big := make([]byte, 3<<20+17)
	_, _ = rand.Read(big)

	t.Run("round trip", func(t *testing.T) {
		for _, tc := range []struct {
			name, path string
			data       []byte
		}{
			{"text in a new directory", "/workspace/d/e/hello.txt", []byte("hello\n")},
			{"empty", "/workspace/empty", nil},
			{"binary, streamed", "/workspace/big.bin", big},
			{"non-UTF-8 name with a newline", "/workspace/n\xffame\nx.txt", []byte("latin1")},
			{"tmp", "/tmp/t.txt", []byte("tmp")},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := write(t, b, info, tc.path, tc.data, backends.WriteOptions{}); err != nil {
					t.Fatal(err)
				}
				got, err := readAll(b, info, tc.path, 0, -1)
				if err != nil || !bytes.Equal(got, tc.data) {
					t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(tc.data))
				}
				fi, err := b.StatFile(ctx, info, tc.path)
				if err != nil || fi.Type != backends.FileTypeFile || fi.Size != int64(len(tc.data)) || fi.Mode != 0o644 {
					t.Fatalf("stat: %+v %v", fi, err)
				}
			})
		}
		if out := mustRun(t, b, info, "stat -c '%u %s' /workspace/d/e/hello.txt"); out != "1000 6" {
			t.Errorf("in the Pod the file is %q, want owner 1000 and 6 bytes", out)
		}
	})

	t.Run("read with offset and length", func(t *testing.T) {
		for _, tc := range []struct {
			name        string
			off, length int64
			want        []byte
		}{
			{"middle", 1 << 20, 100, big[1<<20 : 1<<20+100]},
			{"to the end", int64(len(big)) - 5, -1, big[len(big)-5:]},
			{"past the end", int64(len(big)) + 10, -1, nil},
		} {
			got, err := readAll(b, info, "/workspace/big.bin", tc.off, tc.length)
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Errorf("%s: %d bytes (%v), want %d", tc.name, len(got), err, len(tc.want))
			}
		}
	})

	t.Run("a reader closed early", func(t *testing.T) {
		rc, fi, err := b.ReadFile(ctx, info, "/workspace/big.bin", 0, -1)
		if err != nil || fi.Size != int64(len(big)) {
			t.Fatalf("ReadFile: %+v %v", fi, err)
		}
		buf := make([]byte, 10)
		if _, err := io.ReadFull(rc, buf); err != nil || !bytes.Equal(buf, big[:10]) {
			t.Fatalf("first bytes: %q %v", buf, err)
		}
		if err := rc.Close(); err != nil {
			t.Fatalf("Close after a partial read: %v", err)
		}
	})

	t.Run("append and mode", func(t *testing.T) {
		for _, part := range []string{"a", "b"} {
			if err := write(t, b, info, "/workspace/log.txt", []byte(part), backends.WriteOptions{Append: true, Mode: 0o600}); err != nil {
				t.Fatal(err)
			}
		}
		fi, err := b.StatFile(ctx, info, "/workspace/log.txt")
		if got, _ := readAll(b, info, "/workspace/log.txt", 0, -1); err != nil || string(got) != "ab" || fi.Mode != 0o600 {
			t.Fatalf("append: %q %+v %v", got, fi, err)
		}
	})

	t.Run("list", func(t *testing.T) {
		entries, err := b.ListFiles(ctx, info, "/workspace/d", 2, 100)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Path+":"+e.Type)
		}
		sort.Strings(got)
		if want := "/workspace/d/e/hello.txt:file,/workspace/d/e:dir"; strings.Join(got, ",") != want {
			t.Fatalf("list = %v, want %s", got, want)
		}
	})

	t.Run("mkdir rename remove", func(t *testing.T) {
		steps := []struct {
			name string
			do   func() error
		}{
			{"mkdir", func() error { return b.MakeDir(ctx, info, "/workspace/m/n") }},
			{"write below", func() error { return write(t, b, info, "/workspace/m/n/f", []byte("f"), backends.WriteOptions{}) }},
			{"rename", func() error { return b.RenameFile(ctx, info, "/workspace/m/n", "/workspace/m/renamed") }},
			{"read renamed", func() error {
				if got, err := readAll(b, info, "/workspace/m/renamed/f", 0, -1); err != nil || string(got) != "f" {
					return errors.Join(err, errors.New("read "+string(got)))
				}
				return nil
			}},
			{"remove non-empty refused", func() error {
				if err := b.RemoveFile(ctx, info, "/workspace/m", false); !errors.Is(err, boxerr.ErrValidation) {
					return errors.Join(err, errors.New("want a refusal"))
				}
				return nil
			}},
			{"remove recursive", func() error { return b.RemoveFile(ctx, info, "/workspace/m", true) }},
			{"gone", func() error {
				if _, err := b.StatFile(ctx, info, "/workspace/m"); !errors.Is(err, boxerr.ErrFileNotFound) {
					return errors.Join(err, errors.New("want not found"))
				}
				return nil
			}},
		}
		for _, s := range steps {
			if err := s.do(); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
		}
	})

	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			err    error
			field  string
			reason string
		}{
			{"write outside the mounts (read-only rootfs)", write(t, b, info, "/etc/evil", []byte("x"), backends.WriteOptions{}), "path", outside},
			{"read outside the mounts", func() error { _, err := readAll(b, info, "/etc/passwd", 0, -1); return err }(), "path", outside},
			{"rename across mounts", b.RenameFile(ctx, info, "/workspace/log.txt", "/tmp/log.txt"), "to", ""},
			{"remove the mount point", b.RemoveFile(ctx, info, "/workspace", true), "path", ""},
			{"read a directory", func() error { _, err := readAll(b, info, "/workspace/d", 0, -1); return err }(), "path", ""},
		} {
			t.Run(tc.name, func(t *testing.T) { wantRefused(t, tc.err, tc.field, tc.reason) })
		}
	})
}

// TestFilesSymlinkEscapes: a link to a place outside the session's mounts
// is refused. On kube "outside" is the Pod's own root (its image's
// /etc/passwd, say): the script resolves links in the sandbox container,
// so no link reaches the node's files even if it were followed.
func TestFilesSymlinkEscapes(t *testing.T) {
	b := newBackend(t, "")
	info := start(t, b, spec("links-"+randomID()))
	mustRun(t, b, info, `cd /workspace && echo inside > a.txt &&
		ln -s /etc/passwd x && ln -s ../../../../../../etc/passwd rel && ln -s /proc/1/root proc &&
		ln -s /etc etcdir && ln -s .. up && ln -s /workspace/a.txt inside && ln -s ../tmp tmpdir`)
	for _, tc := range []struct{ name, path string }{
		{"absolute link", "/workspace/x"},
		{"relative dot-dot link", "/workspace/rel"},
		{"proc root", "/workspace/proc/etc/passwd"},
		{"symlinked parent", "/workspace/etcdir/passwd"},
		{"link to the parent of the mount", "/workspace/up/etc/passwd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readAll(b, info, tc.path, 0, -1)
			wantRefused(t, err, "path", outside)
			wantRefused(t, write(t, b, info, tc.path, []byte("x"), backends.WriteOptions{}), "path", "")
		})
	}
	t.Run("links inside the mounts resolve as in the sandbox", func(t *testing.T) {
		if got, err := readAll(b, info, "/workspace/inside", 0, -1); err != nil || string(got) != "inside\n" {
			t.Fatalf("absolute link inside the workspace: %q %v", got, err)
		}
		if err := write(t, b, info, "/workspace/tmpdir/via-link", []byte("t"), backends.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		if out := mustRun(t, b, info, "cat /tmp/via-link"); out != "t" {
			t.Fatalf("a write through ../tmp landed elsewhere: %q", out)
		}
		if fi, err := b.StatFile(context.Background(), info, "/workspace/x"); err != nil || fi.Type != backends.FileTypeSymlink {
			t.Fatalf("stat of the link itself: %+v %v", fi, err)
		}
	})
}

// TestFilesReadOnlyMount: an extra mount whose mode is ro (a mapped
// PersistentVolumeClaim mounted read-only) refuses writes, and reads.
func TestFilesReadOnlyMount(t *testing.T) {
	needCluster(t)
	b := backendWithClaim(t, "/srv/shared")
	withMount := func(mode backends.MountMode) backends.Session {
		s := spec("ro-" + randomID())
		s.ExtraMounts = []backends.MountSpec{{HostPath: "/srv/shared", MountPath: "/shared", Mode: mode}}
		return start(t, b, s)
	}
	// Fill the claim through a session that mounts it read-write.
	rw := withMount(backends.MountRW)
	if err := write(t, b, rw, "/shared/f", []byte("ro"), backends.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.StopSession(context.Background(), rw); err != nil {
		t.Fatal(err)
	}

	ro := withMount(backends.MountRO)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"new file", write(t, b, ro, "/shared/new", []byte("x"), backends.WriteOptions{})},
		{"existing file", write(t, b, ro, "/shared/f", []byte("x"), backends.WriteOptions{})},
		{"mkdir", b.MakeDir(context.Background(), ro, "/shared/dir")},
		{"remove", b.RemoveFile(context.Background(), ro, "/shared/f", false)},
	} {
		t.Run(tc.name, func(t *testing.T) { wantRefused(t, tc.err, "path", "read_only") })
	}
	if got, err := readAll(b, ro, "/shared/f", 0, -1); err != nil || string(got) != "ro" {
		t.Fatalf("read from a ro mount: %q %v", got, err)
	}
}

// TestExportLeavesOutMounts: an extra mount inside the workspace is not
// part of the session's files, so its export leaves it out (with busybox
// tar, which has no --exclude, in the test image).
func TestExportLeavesOutMounts(t *testing.T) {
	needCluster(t)
	b := backendWithClaim(t, "/srv/shared")
	s := spec("export-" + randomID())
	s.ExtraMounts = []backends.MountSpec{{HostPath: "/srv/shared", MountPath: "/workspace/shared", Mode: backends.MountRW}}
	info := start(t, b, s)
	mustRun(t, b, info, "echo mine > /workspace/own && mkdir -p /workspace/shared/d && echo theirs > /workspace/shared/d/f && echo x > /workspace/shared-not")
	var archive bytes.Buffer
	if err := b.ExportFiles(context.Background(), info, backends.ExportOptions{}, &archive); err != nil {
		t.Fatalf("ExportFiles: %v", err)
	}
	names := map[string]bool{}
	tr := tar.NewReader(&archive)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[hdr.Name] = true
	}
	for _, want := range []string{backends.ArchiveWorkspace + "own", backends.ArchiveWorkspace + "shared-not"} {
		if !names[want] {
			t.Errorf("export lacks %s: %v", want, names)
		}
	}
	for n := range names {
		if strings.HasPrefix(n, backends.ArchiveWorkspace+"shared/") || n == backends.ArchiveWorkspace+"shared" {
			t.Errorf("export holds %s, inside the extra mount", n)
		}
	}
}

// backendWithClaim is a backend whose kube.host_path_claims maps hostPath
// to a fresh 16 MiB PersistentVolumeClaim, removed at cleanup.
func backendWithClaim(t *testing.T, hostPath string) *kube.Backend {
	t.Helper()
	claim := "boxrt-claim-" + randomID()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: testNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}},
		},
	}
	if _, err := admin.CoreV1().PersistentVolumeClaims(testNamespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().PersistentVolumeClaims(testNamespace).Delete(context.Background(), claim, metav1.DeleteOptions{})
	})
	instance := "test-" + randomID()
	b, err := kube.New(kube.Config{
		InstanceID: instance, Kubeconfig: kubeconfig, Namespace: testNamespace, Image: testImage, ImagePullPolicy: "Never",
		HostPathClaims: map[string]string{hostPath: claim},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { assertNothingLeft(t, instance) })
	return b
}
