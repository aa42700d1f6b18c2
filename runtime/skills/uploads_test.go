package skills

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// send uploads data as the reference sender does: 16 KiB chunks, in order.
func send(t *testing.T, s *Store, key string, data []byte) error {
	t.Helper()
	n := max(1, (len(data)+ChunkBytes-1)/ChunkBytes)
	length := int64(len(data))
	for i := 0; i < n; i++ {
		chunk := data[i*ChunkBytes : min(len(data), (i+1)*ChunkBytes)]
		size := len(chunk)
		err := s.PutChunk(Chunk{FileKey: key, FileLength: &length, ChunkBase64: base64.StdEncoding.EncodeToString(chunk),
			ChunkIndex: i, ChunkAmount: n, ChunkSize: &size})
		if err != nil {
			return err
		}
	}
	return nil
}

func TestUploadThenInstall(t *testing.T) {
	s, root := testStore(t)
	// Pad the archive with a poorly compressible file so it spans
	// several chunks.
	var b strings.Builder
	for i := 0; b.Len() < 3*ChunkBytes; i++ {
		fmt.Fprintf(&b, "%d,", i*7919%10007)
	}
	data := buildZip(t, zipFile{name: "demo/SKILL.md", body: skillMD("demo", "d", "b")}, zipFile{name: "demo/data.csv", body: b.String()})
	key := "3f2a9c0d1e2b4a5c-0f6e1234567890abcdef1234567890ab.zip"
	if err := send(t, s, key, data); err != nil {
		t.Fatal(err)
	}
	if s.ActiveUploads() != 1 {
		t.Fatal("upload not active")
	}
	fi, err := os.Stat(filepath.Join(s.priv, "uploads"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("upload dir: %v %v", fi, err)
	}
	if fi, _ := os.Stat(s.priv); fi.Mode().Perm() != 0o700 {
		t.Fatalf("private dir mode %v", fi.Mode())
	}
	got, err := s.InstallZip(bg, ZipSource{FileKey: key}, ZipOptions{Filename: "demo.zip", TargetSuffix: "upload"})
	if err != nil || len(got) != 1 {
		t.Fatalf("install: %v %v", got, err)
	}
	if b2, _ := os.ReadFile(filepath.Join(root, "demo-upload", "data.csv")); string(b2) != b.String() {
		t.Fatal("content differs")
	}
	// Consumed: the key is gone from the table and the disk.
	if s.ActiveUploads() != 0 {
		t.Fatal("upload not consumed")
	}
	if des, _ := os.ReadDir(filepath.Join(s.priv, "uploads")); len(des) != 0 {
		t.Fatalf("upload files left: %v", des)
	}
	_, err = s.PreviewZip(bg, ZipSource{FileKey: key}, ZipOptions{})
	wantValidation(t, err, "Uploaded file not found")
	// A hostile upload is consumed as well, and refused.
	evil := withSkill(t, plain("../evil.txt", "x"))
	if err := send(t, s, "evil.zip", evil); err != nil {
		t.Fatal(err)
	}
	_, err = s.InstallZip(bg, ZipSource{FileKey: "evil.zip"}, ZipOptions{})
	wantValidation(t, err, "escapes")
	if s.ActiveUploads() != 0 {
		t.Fatal("hostile upload not consumed")
	}
}

func TestFileChunkRules(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxUploadBytes = 20000
	s, _ := testStoreLimits(t, lim)
	one := base64.StdEncoding.EncodeToString([]byte("x"))
	full := base64.StdEncoding.EncodeToString(make([]byte, ChunkBytes))
	for _, tc := range []struct {
		name string
		c    Chunk
		want string
	}{
		{"empty key", Chunk{FileKey: "", ChunkBase64: one, ChunkAmount: 1}, "Invalid file transfer key"},
		{"padded key", Chunk{FileKey: " a.zip", ChunkBase64: one, ChunkAmount: 1}, "Invalid file transfer key"},
		{"slash", Chunk{FileKey: "a/b.zip", ChunkBase64: one, ChunkAmount: 1}, "Invalid file transfer key"},
		{"backslash", Chunk{FileKey: `a\b.zip`, ChunkBase64: one, ChunkAmount: 1}, "Invalid file transfer key"},
		{"dotdot", Chunk{FileKey: "a..zip", ChunkBase64: one, ChunkAmount: 1}, "Invalid file transfer key"},
		{"leading dot", Chunk{FileKey: ".a.zip", ChunkBase64: one, ChunkAmount: 1}, "Invalid file transfer key"},
		{"absolute", Chunk{FileKey: "/a.zip", ChunkBase64: one, ChunkAmount: 1}, "Invalid file transfer key"},
		{"too long", Chunk{FileKey: strings.Repeat("a", 256), ChunkBase64: one, ChunkAmount: 1}, "Invalid file transfer key"},
		{"chunk too long", Chunk{FileKey: "k", ChunkBase64: full + "AAAA", ChunkAmount: 1}, "exceeds the protocol limit"},
		{"bad base64", Chunk{FileKey: "k", ChunkBase64: "a===", ChunkAmount: 1}, "not valid base64"},
		{"amount 0", Chunk{FileKey: "k", ChunkBase64: one, ChunkAmount: 0}, "Invalid file chunk position"},
		{"index negative", Chunk{FileKey: "k", ChunkBase64: one, ChunkIndex: -1, ChunkAmount: 1}, "Invalid file chunk position"},
		{"index past amount", Chunk{FileKey: "k", ChunkBase64: one, ChunkIndex: 1, ChunkAmount: 1}, "Invalid file chunk position"},
		{"no index 0 first", Chunk{FileKey: "fresh", ChunkBase64: one, ChunkIndex: 1, ChunkAmount: 2}, "Invalid file chunk position"},
		{"chunk_size mismatch", Chunk{FileKey: "k", ChunkBase64: one, ChunkAmount: 1, ChunkSize: ptr(2)}, "chunk_size"},
		{"declared length over limit", Chunk{FileKey: "k", ChunkBase64: one, ChunkAmount: 1, FileLength: ptr[int64](20001)}, "configured size limit"},
	} {
		t.Run(tc.name, func(t *testing.T) { wantValidation(t, s.PutChunk(tc.c), tc.want) })
	}
	// The largest legal chunk is accepted.
	if err := s.PutChunk(Chunk{FileKey: "max", ChunkBase64: full, ChunkAmount: 3}); err != nil {
		t.Fatal(err)
	}
	// Out of order: index 2 after 0.
	wantValidation(t, s.PutChunk(Chunk{FileKey: "max", ChunkBase64: one, ChunkIndex: 2, ChunkAmount: 3}), "Invalid file chunk position")
	// Size cap on the running total: 16384 + 16384 > 20000; the transfer is dropped.
	wantValidation(t, s.PutChunk(Chunk{FileKey: "max", ChunkBase64: full, ChunkIndex: 1, ChunkAmount: 3}), "configured size limit (20000 bytes)")
	_, err := s.PreviewZip(bg, ZipSource{FileKey: "max"}, ZipOptions{})
	wantValidation(t, err, "Uploaded file not found")
	// Incomplete uploads are not consumed.
	s.PutChunk(Chunk{FileKey: "part", ChunkBase64: one, ChunkAmount: 2})
	_, err = s.PreviewZip(bg, ZipSource{FileKey: "part"}, ZipOptions{})
	wantValidation(t, err, "incomplete (1 of 2 chunks received)")
	// file_length mismatch at the end.
	wantValidation(t, s.PutChunk(Chunk{FileKey: "len", ChunkBase64: one, ChunkAmount: 1, FileLength: ptr[int64](5)}), "length mismatch")
	// Index 0 restarts a transfer.
	s.PutChunk(Chunk{FileKey: "re", ChunkBase64: one, ChunkAmount: 2})
	if err := s.PutChunk(Chunk{FileKey: "re", ChunkBase64: one, ChunkAmount: 1}); err != nil {
		t.Fatal(err)
	}
}

func TestUploadCapacityAndExpiry(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s, _ := testStore(t, WithClock(clock))
	one := base64.StdEncoding.EncodeToString([]byte("x"))
	for i := 0; i < MaxActiveUploads; i++ {
		if err := s.PutChunk(Chunk{FileKey: fmt.Sprintf("k%d", i), ChunkBase64: one, ChunkAmount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	err := s.PutChunk(Chunk{FileKey: "one-too-many", ChunkBase64: one, ChunkAmount: 1})
	if !errors.Is(err, boxerr.ErrCapacityExceeded) {
		t.Fatalf("129th key: %v", err)
	}
	// Re-sending an existing key is not a new key.
	if err := s.PutChunk(Chunk{FileKey: "k0", ChunkBase64: one, ChunkAmount: 1}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(UploadTTL + time.Second)
	mu.Unlock()
	if err := s.PutChunk(Chunk{FileKey: "fresh", ChunkBase64: one, ChunkAmount: 1}); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if s.ActiveUploads() != 1 {
		t.Fatalf("stale uploads kept: %d", s.ActiveUploads())
	}
	if des, _ := os.ReadDir(filepath.Join(s.priv, "uploads")); len(des) != 1 {
		t.Fatalf("stale files kept: %d", len(des))
	}
}

func TestUploadTimerSweeps(t *testing.T) {
	s, _ := testStore(t, WithUploadTTL(50*time.Millisecond))
	one := base64.StdEncoding.EncodeToString([]byte("x"))
	if err := s.PutChunk(Chunk{FileKey: "abandoned", ChunkBase64: one, ChunkAmount: 2}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.ActiveUploads() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("abandoned upload never swept")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCloseRemovesPrivateDir(t *testing.T) {
	s, _ := testStore(t)
	if err := send(t, s, "k.zip", []byte("data")); err != nil {
		t.Fatal(err)
	}
	priv := s.priv
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(priv); !os.IsNotExist(err) {
		t.Fatal("private dir left after Close")
	}
	err := send(t, s, "k.zip", []byte("data"))
	if !errors.Is(err, boxerr.ErrRuntimeUnavailable) {
		t.Fatalf("after close: %v", err)
	}
}
