package kube_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/backends/kube"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// TestSuspendResume: suspend deletes the Pod and keeps the claims; another
// replica adopts the session as suspended and resumes it with its files,
// /tmp's included.
func TestSuspendResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a := newBackend(t, "")
	s := spec("suspend-" + randomID())
	s.Persistent = true
	info := start(t, a, s)
	mustRun(t, a, info, "echo kept > /workspace/state && echo tmp-kept > /tmp/state")

	if err := a.Suspend(ctx, info); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	if _, err := admin.CoreV1().Pods(testNamespace).Get(ctx, info.BackendSessionID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Pod after Suspend: err = %v, want NotFound", err)
	}
	left := objects(t, a.InstanceID())
	for _, want := range []string{"pvc/" + info.BackendSessionID, "pvc/" + info.BackendSessionID + "-tmp", "networkpolicy/" + info.BackendSessionID} {
		if !slices.Contains(left, want) {
			t.Errorf("after Suspend the cluster holds %v, want %s kept", left, want)
		}
	}
	pvc, err := admin.CoreV1().PersistentVolumeClaims(testNamespace).Get(ctx, info.BackendSessionID, metav1.GetOptions{})
	if err != nil || pvc.Annotations[kube.AnnSuspended] == "" {
		t.Errorf("claim after Suspend: %v, annotations %v; want the %s mark", err, pvc.Annotations, kube.AnnSuspended)
	}
	if a.Alive(ctx, info) {
		t.Error("Alive reports a suspended session")
	}
	// Suspending again (say, from another replica) is a no-op.
	if err := a.Suspend(ctx, info); err != nil {
		t.Errorf("second Suspend: %v", err)
	}

	b := newBackend(t, a.InstanceID())
	adopted, err := b.Adopt(ctx)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if len(adopted) != 1 || adopted[0].SessionID != s.SessionID || adopted[0].State != backends.StateSuspended {
		t.Fatalf("Adopt = %+v, want %s suspended", adopted, s.SessionID)
	}
	if !adopted[0].Persistent || adopted[0].MemoryMB != 64 || adopted[0].CreatedAt.IsZero() {
		t.Errorf("suspended session lost its spec: %+v", adopted[0])
	}
	// Adopt's garbage collection kept the suspended session's objects.
	if left := objects(t, a.InstanceID()); !slices.Contains(left, "pvc/"+info.BackendSessionID) || !slices.Contains(left, "pvc/"+info.BackendSessionID+"-tmp") {
		t.Fatalf("Adopt removed a suspended claim: %v", left)
	}

	if err := b.Resume(ctx, adopted[0]); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if got := mustRun(t, b, adopted[0], "cat /workspace/state /tmp/state"); got != "kept\ntmp-kept" {
		t.Errorf("workspace and /tmp after resume = %q, want kept and tmp-kept", got)
	}
	again, err := a.Adopt(ctx)
	if err != nil || len(again) != 1 || again[0].State == backends.StateSuspended {
		t.Errorf("Adopt after Resume = %+v, %v; want one running session", again, err)
	}
}

// TestSuspendRefusesEmptyDir: a session whose workspace goes with its Pod
// is never suspended.
func TestSuspendRefusesEmptyDir(t *testing.T) {
	a := newBackend(t, "")
	info := start(t, a, spec("nosuspend-"+randomID()))
	if a.CanSuspend(info) {
		t.Error("CanSuspend(non-persistent) = true")
	}
	err := a.Suspend(context.Background(), info)
	if !errors.Is(err, boxerr.ErrBox) {
		t.Fatalf("Suspend(non-persistent) = %v, want BoxError", err)
	}
	if !a.Alive(context.Background(), info) {
		t.Error("a refused Suspend stopped the session")
	}
}

// TestSnapshotAndFork: the workspace and /tmp exported from a session
// (running or suspended) and imported into a new one have the same bytes;
// the copy is independent.
func TestSnapshotAndFork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b := newBackend(t, "")
	s := spec("snap-" + randomID())
	s.Persistent = true
	src := start(t, b, s)
	payload := make([]byte, 300<<10)
	_, _ = rand.Read(payload)
	mustRun(t, b, src, "mkdir /workspace/dir")
	upload(t, src.BackendSessionID, "/workspace/dir/blob.bin", payload)
	mustRun(t, b, src, "ln -s dir/blob.bin /workspace/link && chmod 750 /workspace/dir && mkdir /tmp/t && echo in-tmp > /tmp/t/f")
	want := mustRun(t, b, src, "sha256sum /workspace/dir/blob.bin | cut -d' ' -f1")
	if sum := sha(payload); want != sum {
		t.Fatalf("uploaded blob hash %s, want %s", want, sum)
	}

	// Permission bits only: the setgid bit of directories is fsGroup's
	// doing (busybox tar leaves the one mkdir inherits).
	const meta = "readlink /workspace/link; stat -c %a /workspace/dir | tail -c 4"
	wantMeta := mustRun(t, b, src, meta)
	var snap bytes.Buffer
	if err := b.ExportFiles(ctx, src, backends.ExportOptions{}, &snap); err != nil {
		t.Fatalf("ExportFiles: %v", err)
	}
	restore := func(name string, archive []byte) backends.Session {
		t.Helper()
		dst := start(t, b, spec(name+"-"+randomID()))
		if err := b.ImportFiles(ctx, dst, bytes.NewReader(archive)); err != nil {
			t.Fatalf("ImportFiles: %v", err)
		}
		if got := mustRun(t, b, dst, "sha256sum /workspace/link | cut -d' ' -f1"); got != want {
			t.Errorf("%s: restored blob hash %s, want %s", name, got, want)
		}
		if got := mustRun(t, b, dst, meta); got != wantMeta {
			t.Errorf("%s: restored link and mode = %q, want %q", name, got, wantMeta)
		}
		if got := mustRun(t, b, dst, "cat /tmp/t/f"); got != "in-tmp" {
			t.Errorf("%s: restored /tmp/t/f = %q, want in-tmp", name, got)
		}
		return dst
	}
	fork := restore("restored", snap.Bytes())

	// The fork diverges from its source.
	mustRun(t, b, fork, "echo fork > /workspace/dir/only-fork")
	mustRun(t, b, src, "echo src > /workspace/dir/blob.bin")
	if got := mustRun(t, b, src, "ls /workspace/dir"); got != "blob.bin" {
		t.Errorf("source sees the fork's file: %q", got)
	}
	if got := mustRun(t, b, fork, "sha256sum /workspace/dir/blob.bin | cut -d' ' -f1"); got != want {
		t.Errorf("fork sees the source's write: hash %s", got)
	}

	// A suspended session exports too (a Pod on its claim for the time of
	// the export), and stays suspended.
	mustRun(t, b, src, "echo v2 > /workspace/v2")
	if err := b.Suspend(ctx, src); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	src.State = backends.StateSuspended
	snap.Reset()
	if err := b.ExportFiles(ctx, src, backends.ExportOptions{}, &snap); err != nil {
		t.Fatalf("ExportFiles(suspended): %v", err)
	}
	if _, err := admin.CoreV1().Pods(testNamespace).Get(ctx, src.BackendSessionID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Pod after exporting a suspended session: %v, want NotFound", err)
	}
	dst := start(t, b, spec("from-suspended-"+randomID()))
	if err := b.ImportFiles(ctx, dst, bytes.NewReader(snap.Bytes())); err != nil {
		t.Fatalf("ImportFiles: %v", err)
	}
	if got := mustRun(t, b, dst, "cat /workspace/v2 /tmp/t/f"); got != "v2\nin-tmp" {
		t.Errorf("files from suspended export = %q", got)
	}

	// Another backend's archive part is refused by name.
	err := b.ImportFiles(ctx, dst, bytes.NewReader(rootfsArchive(t)))
	if !errors.Is(err, boxerr.ErrValidation) {
		t.Errorf("ImportFiles(rootfs/ entry) = %v, want BoxValidationError", err)
	}
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// rootfsArchive is a docker-style archive with a rootfs/ entry.
func rootfsArchive(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "rootfs/etc/x", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte("x"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestHostileArchives restores crafted archives into a Pod: each hostile
// one is refused (typed) before tar in the Pod sees it, and setuid bits
// are cleared.
func TestHostileArchives(t *testing.T) {
	b := newBackend(t, "")
	backendtest.HostileArchives(t, backendtest.Env{
		Backend: b,
		Spec:    func(name string) backends.SandboxSpec { return spec(name + "-" + randomID()) },
	}, backendtest.HostileOptions{})
}
