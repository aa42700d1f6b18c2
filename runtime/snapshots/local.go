package snapshots

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// LimitName is the configuration key of the store bound, named by
// BoxCapacityExceededError.
const LimitName = "durable.snapshot_max_total_mb"

var idRe = regexp.MustCompile(`^snap-[0-9a-f]{16}$`)

// Local is the directory store (see the package doc for its layout).
type Local struct {
	dir string
	key []byte // seals manifests (see seal)

	mu sync.Mutex // serialises Put's size check with Delete; guards maxBytes
	// maxBytes bounds the total size of the stored archives.
	maxBytes int64
}

var _ Store = (*Local)(nil)

// OpenLocal prepares dir (creating it 0700), loads or makes its sealing
// key, and removes what a crash left: temp files and archives no manifest
// names (a kill -9 between the two renames of a Put).
func OpenLocal(dir string, maxBytes int64) (*Local, error) {
	for _, d := range []string{"blobs/sha256", "manifests", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, storeError(dir, err)
		}
	}
	if entries, err := os.ReadDir(filepath.Join(dir, "tmp")); err == nil {
		for _, e := range entries {
			_ = os.Remove(filepath.Join(dir, "tmp", e.Name()))
		}
	}
	l := &Local{dir: dir, maxBytes: maxBytes}
	key, err := l.loadKey()
	if err != nil {
		return nil, err
	}
	l.key = key
	l.dropUnusedBlobs()
	return l, nil
}

// keySize is the length of a store's sealing key.
const keySize = 32

// loadKey reads the store's key, making it (temp file, then a link that
// fails if another process made one first) when there is none.
func (l *Local) loadKey() ([]byte, error) {
	path := filepath.Join(l.dir, "key")
	key, err := os.ReadFile(path)
	if err == nil && len(key) == keySize {
		return key, nil
	}
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return nil, boxerr.Failure("snapshot store %s: its key %s is unreadable or damaged (%v): move the store aside to start a new one", l.dir, path, err)
	}
	key = make([]byte, keySize)
	if _, err := rand.Read(key); err != nil {
		return nil, storeError(l.dir, err)
	}
	tmp, err := l.writeTemp("key-", key)
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); errors.Is(err, fs.ErrExist) {
		return l.loadKey()
	} else if err != nil {
		return nil, storeError(l.dir, err)
	}
	return key, nil
}

// seal is the manifest's HMAC-SHA256 under the store's key, over its JSON
// without the seal. A manifest edited by hand (another spec, another
// archive) or copied from another store does not carry this store's seal.
func (l *Local) seal(m Manifest) string {
	m.Seal = ""
	data, _ := json.Marshal(m)
	mac := hmac.New(sha256.New, l.key)
	mac.Write(data)
	return "hmac-sha256:" + hex.EncodeToString(mac.Sum(nil))
}

// storeError types a failure of the store's filesystem; a full disk says
// so, since freeing space is what fixes it.
func storeError(dir string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return boxerr.Failure("snapshot store %s: its filesystem is full (%v): free space there, delete snapshots, or set durable.snapshot_dir to a larger one", dir, err).
			With("reason", "disk_full").Wrap(err)
	}
	return boxerr.Failure("snapshot store %s: %v", dir, err).Wrap(err)
}

// SetMaxBytes changes the bound (a configuration change).
func (l *Local) SetMaxBytes(n int64) {
	l.mu.Lock()
	l.maxBytes = n
	l.mu.Unlock()
}

func (l *Local) limit() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxBytes
}

func (l *Local) blobPath(digest string) (string, error) {
	hexSum, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hexSum) != 64 || strings.Trim(hexSum, "0123456789abcdef") != "" {
		return "", fmt.Errorf("bad digest %q", digest)
	}
	return filepath.Join(l.dir, "blobs", "sha256", hexSum+".tar.zst"), nil
}

func (l *Local) manifestPath(id string) (string, error) {
	if !idRe.MatchString(id) {
		return "", boxerr.Validation("snapshot_id", "snapshot_id %q is not a snapshot id (snap-<16 hex>)", id)
	}
	return filepath.Join(l.dir, "manifests", id+".json"), nil
}

// countingWriter counts and hashes what passes and stops at a limit.
type countingWriter struct {
	w     io.Writer
	h     hash.Hash
	n     int64
	limit int64
}

var errTooBig = errors.New("snapshot store full")

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.limit {
		return 0, errTooBig
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	return n, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func capacityError(max int64) error {
	mb := int(max >> 20)
	return boxerr.CapacityExceeded(LimitName, mb, "snapshot store is full: %s is %d MiB; delete snapshots or raise it", LimitName, mb)
}

// Put implements Store.
func (l *Local) Put(ctx context.Context, m Manifest, archive io.Reader) (Manifest, error) {
	max := l.limit()
	used, err := l.usedBytes()
	if err != nil {
		return m, err
	}
	room := max - used
	if room <= 0 {
		return m, capacityError(max)
	}
	tmp, err := os.CreateTemp(filepath.Join(l.dir, "tmp"), "blob-*")
	if err != nil {
		return m, storeError(l.dir, err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	cw := &countingWriter{w: tmp, h: sha256.New(), limit: room}
	enc, err := zstd.NewWriter(cw, zstd.WithEncoderConcurrency(1))
	if err != nil {
		tmp.Close()
		return m, boxerr.Failure("snapshot store: %v", err).Wrap(err)
	}
	src := &countingReader{r: archive}
	_, err = io.Copy(enc, readerCtx{ctx, src})
	if cerr := enc.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, errTooBig) {
		return m, capacityError(max)
	}
	if err != nil {
		var be *boxerr.Error
		if errors.As(err, &be) {
			return m, be
		}
		return m, storeError(l.dir, err)
	}

	m.Digest = "sha256:" + hex.EncodeToString(cw.h.Sum(nil))
	m.SizeBytes, m.RawBytes = cw.n, src.n
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now().UTC()
	}
	if m.ID, err = newID(); err != nil {
		return m, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Checked again under the lock: concurrent Puts each saw room.
	if used, err := l.usedBytes(); err != nil {
		return m, err
	} else if used+m.SizeBytes > l.maxBytes {
		return m, capacityError(l.maxBytes)
	}
	blob, _ := l.blobPath(m.Digest)
	if err := os.Rename(tmp.Name(), blob); err != nil {
		return m, storeError(l.dir, err)
	}
	if err := l.writeManifest(m); err != nil {
		l.dropBlobIfUnused(m.Digest)
		return m, err
	}
	return m, nil
}

// readerCtx stops a copy when ctx ends.
type readerCtx struct {
	ctx context.Context
	r   io.Reader
}

func (r readerCtx) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

func newID() (string, error) {
	buf := make([]byte, 8)
	if _, err := rand.Read(buf); err != nil {
		return "", boxerr.Failure("snapshot id: %v", err).Wrap(err)
	}
	return "snap-" + hex.EncodeToString(buf), nil
}

func (l *Local) writeManifest(m Manifest) error {
	m.Seal = l.seal(m)
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp, err := l.writeTemp("manifest-", data)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	path, _ := l.manifestPath(m.ID)
	if err := os.Rename(tmp, path); err != nil {
		return storeError(l.dir, err)
	}
	return nil
}

// writeTemp writes data to a new synced file in tmp/ and returns its name.
func (l *Local) writeTemp(prefix string, data []byte) (string, error) {
	tmp, err := os.CreateTemp(filepath.Join(l.dir, "tmp"), prefix+"*")
	if err != nil {
		return "", storeError(l.dir, err)
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", storeError(l.dir, err)
	}
	return tmp.Name(), nil
}

// usedBytes sums the stored archives.
func (l *Local) usedBytes() (int64, error) {
	entries, err := os.ReadDir(filepath.Join(l.dir, "blobs", "sha256"))
	if err != nil {
		return 0, boxerr.Failure("snapshot store: %v", err).Wrap(err)
	}
	var n int64
	for _, e := range entries {
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n, nil
}

// Get implements Store.
func (l *Local) Get(_ context.Context, id string) (Manifest, error) {
	path, err := l.manifestPath(id)
	if err != nil {
		return Manifest{}, err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, ErrNotExist(id)
	}
	if err != nil {
		return Manifest{}, boxerr.Failure("reading snapshot %s: %v", id, err).Wrap(err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil || m.ID != id {
		return Manifest{}, boxerr.SnapshotCorrupted(id, "snapshot %s has an unreadable manifest; delete it", id)
	}
	if !hmac.Equal([]byte(m.Seal), []byte(l.seal(m))) {
		return Manifest{}, boxerr.SnapshotCorrupted(id, "snapshot %s was not written by this store: its manifest was altered or copied from another store; it is never restored: delete it", id)
	}
	m.Seal = ""
	return m, nil
}

// Open implements Store: the whole archive is hashed before the first
// byte is returned, so nothing is restored from a corrupted snapshot.
func (l *Local) Open(ctx context.Context, id string) (Manifest, io.ReadCloser, error) {
	m, err := l.Get(ctx, id)
	if err != nil {
		return m, nil, err
	}
	blob, err := l.blobPath(m.Digest)
	if err != nil {
		return m, nil, boxerr.SnapshotCorrupted(id, "snapshot %s: %v", id, err)
	}
	f, err := os.Open(blob)
	if err != nil {
		return m, nil, boxerr.SnapshotCorrupted(id, "snapshot %s: its archive is missing: %v", id, err).Wrap(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, readerCtx{ctx, f})
	if err != nil {
		f.Close()
		return m, nil, boxerr.Failure("reading snapshot %s: %v", id, err).Wrap(err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != m.Digest || n != m.SizeBytes {
		f.Close()
		return m, nil, boxerr.SnapshotCorrupted(id, "snapshot %s is corrupted: its archive has digest %s and %d bytes, the manifest says %s and %d",
			id, got, n, m.Digest, m.SizeBytes)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return m, nil, boxerr.Failure("reading snapshot %s: %v", id, err).Wrap(err)
	}
	dec, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1))
	if err != nil {
		f.Close()
		return m, nil, boxerr.SnapshotCorrupted(id, "snapshot %s does not decode: %v", id, err).Wrap(err)
	}
	return m, &archiveReader{id: id, dec: dec, f: f}, nil
}

// archiveReader decompresses; a decoding failure is a corrupted snapshot.
type archiveReader struct {
	id  string
	dec *zstd.Decoder
	f   *os.File
}

func (a *archiveReader) Read(p []byte) (int, error) {
	n, err := a.dec.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = boxerr.SnapshotCorrupted(a.id, "snapshot %s does not decode: %v", a.id, err).Wrap(err)
	}
	return n, err
}

func (a *archiveReader) Close() error {
	a.dec.Close()
	return a.f.Close()
}

// List implements Store.
func (l *Local) List(ctx context.Context) ([]Manifest, error) {
	entries, err := os.ReadDir(filepath.Join(l.dir, "manifests"))
	if err != nil {
		return nil, boxerr.Failure("snapshot store: %v", err).Wrap(err)
	}
	out := []Manifest{}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !idRe.MatchString(id) {
			continue
		}
		// Only snapshots that can be restored are listed: a sealed
		// manifest whose archive is there.
		m, err := l.Get(ctx, id)
		if err != nil {
			continue
		}
		if blob, err := l.blobPath(m.Digest); err == nil {
			if _, err := os.Stat(blob); err == nil {
				out = append(out, m)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, id string) error {
	m, err := l.Get(ctx, id)
	if err != nil && !errors.Is(err, boxerr.ErrSnapshotCorrupted) {
		return err
	}
	path, _ := l.manifestPath(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := os.Remove(path); err != nil {
		return boxerr.Failure("deleting snapshot %s: %v", id, err).Wrap(err)
	}
	if m.Digest != "" {
		l.dropBlobIfUnused(m.Digest)
	}
	return nil
}

// dropBlobIfUnused removes an archive no manifest names any more. l.mu is
// held.
func (l *Local) dropBlobIfUnused(digest string) {
	if !l.namedDigests()[digest] {
		if blob, err := l.blobPath(digest); err == nil {
			_ = os.Remove(blob)
		}
	}
}

// dropUnusedBlobs removes every archive no manifest names (OpenLocal).
func (l *Local) dropUnusedBlobs() {
	named := l.namedDigests()
	dir := filepath.Join(l.dir, "blobs", "sha256")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		hexSum, _ := strings.CutSuffix(e.Name(), ".tar.zst")
		if !named["sha256:"+hexSum] {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// namedDigests are the digests the manifests name, sealed or not (an
// unsealed manifest is refused, not silently robbed of its archive).
func (l *Local) namedDigests() map[string]bool {
	out := map[string]bool{}
	entries, _ := os.ReadDir(filepath.Join(l.dir, "manifests"))
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(l.dir, "manifests", e.Name()))
		if err != nil {
			continue
		}
		var m Manifest
		if json.Unmarshal(data, &m) == nil {
			out[m.Digest] = true
		}
	}
	return out
}
