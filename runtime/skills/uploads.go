package skills

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// File transfer rules (reference §1.7).
const (
	ChunkBytes       = 16384
	MaxChunkBase64   = 21848 // base64 length of ChunkBytes
	MaxActiveUploads = 128
	UploadTTL        = 10 * time.Minute
)

// fileKeyRE is compiled on first use: its counted repetition costs
// milliseconds to compile, which every boxrt process (the session agent
// among them) would otherwise pay at start.
var fileKeyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$`) })

// Chunk is one __file_chunk request. FileLength and ChunkSize are optional
// cross-checks (the reference ignores them; boxrt refuses a mismatch
// rather than installing a truncated archive).
type Chunk struct {
	FileKey     string
	FileLength  *int64
	ChunkBase64 string
	ChunkIndex  int
	ChunkAmount int
	ChunkSize   *int
}

// uploads stages __file_chunk transfers in the store's private directory.
// One mutex covers the table and the (small, sequential) chunk writes;
// uploads are not on any hot path.
type uploads struct {
	store *Store

	mu     sync.Mutex
	active map[string]*upload
	timer  *time.Timer
	closed bool
}

type upload struct {
	path     string
	size     int64
	next     int // index of the next expected chunk
	amount   int
	length   *int64
	complete bool
	touched  time.Time
}

// ValidateFileKey applies the reference's transfer key rule.
func ValidateFileKey(key string) error {
	if key != strings.TrimSpace(key) || filepath.IsAbs(key) || strings.ContainsAny(key, `/\`) ||
		strings.Contains(key, "..") || !fileKeyRE().MatchString(key) {
		return boxerr.Validation("file_key", "Invalid file transfer key: %q", key)
	}
	return nil
}

// PutChunk stores one chunk. Index 0 starts (or restarts) the transfer;
// every later index must be the next one in order, so a lost or repeated
// chunk fails loudly instead of corrupting the file.
func (s *Store) PutChunk(c Chunk) error {
	if err := ValidateFileKey(c.FileKey); err != nil {
		return err
	}
	if len(c.ChunkBase64) > MaxChunkBase64 {
		return boxerr.Validation("chunk_base64", "File transfer chunk exceeds the protocol limit")
	}
	data, err := base64.StdEncoding.Strict().DecodeString(c.ChunkBase64)
	if err != nil {
		return boxerr.Validation("chunk_base64", "File transfer chunk is not valid base64: %v", err).Wrap(err)
	}
	if len(data) > ChunkBytes {
		return boxerr.Validation("chunk_base64", "File transfer chunk exceeds the protocol limit")
	}
	if c.ChunkAmount <= 0 || c.ChunkIndex < 0 || c.ChunkIndex >= c.ChunkAmount {
		return boxerr.Validation("chunk_index", "Invalid file chunk position")
	}
	if c.ChunkSize != nil && *c.ChunkSize != len(data) {
		return boxerr.Validation("chunk_size", "chunk_size %d does not match the decoded chunk (%d bytes)", *c.ChunkSize, len(data))
	}
	limit := s.limits().MaxUploadBytes
	if c.FileLength != nil && (*c.FileLength < 0 || *c.FileLength > limit) {
		return boxerr.Validation("file_length", "File transfer exceeds the configured size limit (%d bytes)", limit)
	}
	return s.uploads.put(c, data, limit)
}

func (u *uploads) put(c Chunk, data []byte, limit int64) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return boxerr.RuntimeUnavailable("skill store is closed")
	}
	now := u.store.now()
	u.sweepLocked(now)
	up := u.active[c.FileKey]
	flag := os.O_WRONLY | os.O_APPEND
	if c.ChunkIndex == 0 {
		if up == nil {
			if len(u.active) >= MaxActiveUploads {
				return boxerr.CapacityExceeded("max_active_uploads", MaxActiveUploads, "Active file transfer capacity reached (%d)", MaxActiveUploads)
			}
			priv, err := u.store.privateDir()
			if err != nil {
				return err
			}
			dir := filepath.Join(priv, "uploads")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return boxerr.Failure("create upload dir: %v", err).Wrap(err)
			}
			up = &upload{path: filepath.Join(dir, c.FileKey)}
			if u.active == nil {
				u.active = map[string]*upload{}
			}
			u.active[c.FileKey] = up
		}
		up.size, up.next, up.amount, up.length, up.complete = 0, 0, c.ChunkAmount, c.FileLength, false
		flag = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	} else if up == nil || up.complete || up.next != c.ChunkIndex || up.amount != c.ChunkAmount {
		return boxerr.Validation("chunk_index", "Invalid file chunk position")
	}
	up.touched = now
	if up.size+int64(len(data)) > limit {
		u.dropLocked(c.FileKey)
		return boxerr.Validation("chunk_base64", "File transfer exceeds the configured size limit (%d bytes)", limit)
	}
	f, err := os.OpenFile(up.path, flag, 0o600)
	if err == nil {
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		u.dropLocked(c.FileKey)
		return boxerr.Failure("store file chunk: %v", err).Wrap(err)
	}
	up.size += int64(len(data))
	up.next++
	if up.next == up.amount {
		up.complete = true
		if up.length != nil && *up.length != up.size {
			u.dropLocked(c.FileKey)
			return boxerr.Validation("file_length", "File transfer length mismatch: received %d bytes, file_length is %d", up.size, *up.length)
		}
	}
	u.armLocked()
	return nil
}

// take consumes a completed upload: the file is opened, unlinked and
// forgotten, so it is read exactly once and never outlives the call.
func (u *uploads) take(key string) (*os.File, int64, error) {
	if err := ValidateFileKey(key); err != nil {
		return nil, 0, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sweepLocked(u.store.now())
	up := u.active[key]
	if up == nil {
		return nil, 0, boxerr.Validation("file_key", "Uploaded file not found: %s (send it with __file_chunk first; uploads are consumed by one call)", key)
	}
	if !up.complete {
		return nil, 0, boxerr.Validation("file_key", "File transfer %s is incomplete (%d of %d chunks received)", key, up.next, up.amount)
	}
	f, err := os.Open(up.path)
	u.dropLocked(key)
	if err != nil {
		return nil, 0, boxerr.Failure("open upload %s: %v", key, err).Wrap(err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, boxerr.Failure("stat upload %s: %v", key, err).Wrap(err)
	}
	// Re-check the size: the limit may have been lowered since.
	if limit := u.store.limits().MaxUploadBytes; fi.Size() > limit {
		f.Close()
		return nil, 0, boxerr.Validation("file_key", "File transfer exceeds the configured size limit (%d bytes)", limit)
	}
	return f, fi.Size(), nil
}

func (u *uploads) dropLocked(key string) {
	if up := u.active[key]; up != nil {
		// Best effort: whatever is left goes with the private dir at Close.
		_ = os.Remove(up.path)
		delete(u.active, key)
	}
}

// sweepLocked removes uploads untouched for longer than the TTL.
func (u *uploads) sweepLocked(now time.Time) {
	for key, up := range u.active {
		if now.Sub(up.touched) > u.store.uploadTTL {
			u.dropLocked(key)
		}
	}
}

// armLocked makes sure a timer will sweep while uploads exist, so an
// abandoned transfer is deleted even if no other upload ever comes.
func (u *uploads) armLocked() {
	if u.timer != nil || len(u.active) == 0 {
		return
	}
	// Fire when the oldest upload expires (a little after, so it is
	// strictly older than the TTL by then).
	now := u.store.now()
	wait := u.store.uploadTTL
	for _, up := range u.active {
		wait = min(wait, up.touched.Add(u.store.uploadTTL).Sub(now))
	}
	u.timer = time.AfterFunc(max(wait, 0)+time.Second, u.tick)
}

func (u *uploads) tick() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.timer = nil
	if u.closed {
		return
	}
	u.sweepLocked(u.store.now())
	u.armLocked()
}

// count reports how many transfers are in progress or waiting.
func (u *uploads) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.active)
}

func (u *uploads) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	if u.timer != nil {
		u.timer.Stop()
		u.timer = nil
	}
	for key := range u.active {
		u.dropLocked(key)
	}
}

// ActiveUploads is the number of staged transfers (for status and tests).
func (s *Store) ActiveUploads() int { return s.uploads.count() }
