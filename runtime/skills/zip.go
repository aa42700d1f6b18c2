package skills

import (
	"archive/zip"
	"compress/flate"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// zipPiece is how much is decompressed at a time; limits are re-checked
// after every piece, so a lying archive costs at most one piece of memory.
const zipPiece = 64 << 10

// zipEntry is an archive member that passed the static checks.
type zipEntry struct {
	f    *zip.File
	rel  string // cleaned, "/"-separated, relative
	dir  bool
	exec bool
}

func zipError(format string, args ...any) *boxerr.Error {
	return boxerr.Validation("archive", format, args...)
}

// cleanEntryName checks one member name (reference §8.5) and returns its
// cleaned relative path: non-empty, no NUL, backslashes taken as '/', not
// absolute, not escaping with "..", and no drive-letter first component.
func cleanEntryName(raw string) (rel string, dirName bool, err error) {
	if raw == "" {
		return "", false, zipError("Archive entry has an empty name")
	}
	if strings.ContainsRune(raw, 0) {
		return "", false, zipError("Archive entry name contains a NUL byte: %q", raw)
	}
	n := strings.ReplaceAll(raw, `\`, "/")
	dirName = strings.HasSuffix(n, "/")
	if strings.HasPrefix(n, "/") {
		return "", false, zipError("Archive entry has an absolute path: %q", raw)
	}
	c := path.Clean(n)
	if c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", false, zipError("Archive entry escapes the extraction directory: %q", raw)
	}
	first, _, _ := strings.Cut(c, "/")
	if len(first) >= 2 && first[1] == ':' && (first[0]|0x20) >= 'a' && (first[0]|0x20) <= 'z' {
		return "", false, zipError("Archive entry looks like a drive path: %q", raw)
	}
	return c, dirName, nil
}

// Unix file type bits as stored in the high half of ExternalAttrs.
const (
	unixTypeMask = 0o170000
	unixRegular  = 0o100000
	unixDir      = 0o040000
	unixSymlink  = 0o120000
)

// checkArchive runs every static check before a byte is written: entry
// count, names, types, declared sizes and ratios, duplicates, file/dir
// conflicts and overlapping data (the "overlapping files" bomb).
func checkArchive(zr *zip.Reader, size int64, lim Limits) ([]zipEntry, error) {
	if len(zr.File) > lim.MaxZipEntries {
		return nil, zipError("Uploaded archive has too many entries (%d > %d)", len(zr.File), lim.MaxZipEntries)
	}
	entries := make([]zipEntry, 0, len(zr.File))
	seen := map[string]bool{}
	dirs := map[string]bool{}
	var sumC, sumU uint64
	type span struct {
		off, end int64
		name     string
	}
	var spans []span
	for _, f := range zr.File {
		rel, dirName, err := cleanEntryName(f.Name)
		if err != nil {
			return nil, err
		}
		mode := f.Mode()
		unixType := (f.ExternalAttrs >> 16) & unixTypeMask
		if mode&fs.ModeSymlink != 0 || unixType == unixSymlink {
			return nil, zipError("Archive entry is a symlink: %q", f.Name)
		}
		if mode.Type()&^fs.ModeDir != 0 || (unixType != 0 && unixType != unixRegular && unixType != unixDir) {
			return nil, zipError("Archive entry is not a regular file or directory: %q", f.Name)
		}
		if f.Flags&0x1 != 0 {
			return nil, zipError("Archive entry is encrypted: %q", f.Name)
		}
		isDir := dirName || mode.IsDir()
		u, c := f.UncompressedSize64, f.CompressedSize64
		if isDir && u != 0 {
			return nil, zipError("Archive directory entry has a non-zero size: %q", f.Name)
		}
		if u > uint64(lim.MaxZipEntryBytes) {
			return nil, zipError("Archive entry %q exceeds the uncompressed size limit (%d bytes)", f.Name, lim.MaxZipEntryBytes)
		}
		if u > 0 && c == 0 {
			return nil, zipError("Archive entry %q is not empty but has a compressed size of 0", f.Name)
		}
		if c > 0 && u > c*uint64(lim.MaxZipRatio) {
			return nil, zipError("Archive entry %q exceeds the compression ratio limit (%d)", f.Name, lim.MaxZipRatio)
		}
		if f.Method != zip.Store && f.Method != zip.Deflate && !isDir {
			return nil, zipError("Archive entry %q uses an unsupported compression method (%d)", f.Name, f.Method)
		}
		if seen[rel] {
			return nil, zipError("Duplicate archive entry: %q", f.Name)
		}
		seen[rel] = true
		if isDir {
			dirs[rel] = true
		}
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
		sumC += c
		sumU += u
		if c > 0 {
			off, err := f.DataOffset()
			if err != nil || off < 0 || off+int64(c) > size {
				return nil, zipError("Archive entry %q is corrupt", f.Name)
			}
			spans = append(spans, span{off, off + int64(c), f.Name})
		}
		entries = append(entries, zipEntry{f: f, rel: rel, dir: isDir, exec: mode.Perm()&0o111 != 0})
	}
	for _, e := range entries {
		if !e.dir && dirs[e.rel] {
			return nil, zipError("Archive entry %q is both a file and a directory", e.f.Name)
		}
	}
	if sumC > uint64(lim.MaxZipBytes) {
		return nil, zipError("Uploaded archive exceeds the compressed size limit (%d bytes)", lim.MaxZipBytes)
	}
	if sumU > uint64(lim.MaxZipTotalBytes) {
		return nil, zipError("Uploaded archive exceeds the total uncompressed size limit (%d bytes)", lim.MaxZipTotalBytes)
	}
	if sumC > 0 && sumU > sumC*uint64(lim.MaxZipRatio) {
		return nil, zipError("Uploaded archive exceeds the compression ratio limit (%d)", lim.MaxZipRatio)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
	for i := 1; i < len(spans); i++ {
		if spans[i].off < spans[i-1].end {
			return nil, zipError("Archive entries overlap: %q and %q", spans[i-1].name, spans[i].name)
		}
	}
	return entries, nil
}

// extractArchive checks the archive in ra and extracts it into dest (an
// empty private directory). Sizes are enforced on the bytes actually
// decompressed: an entry may not produce more than it declares, nor more
// than the per-entry or total limits, and must produce exactly what it
// declares with a matching CRC-32.
func extractArchive(ctx context.Context, ra io.ReaderAt, size int64, lim Limits, dest string) error {
	if size == 0 {
		return zipError("Uploaded file is empty")
	}
	if size > lim.MaxZipBytes {
		return zipError("Uploaded archive exceeds the compressed size limit (%d bytes)", lim.MaxZipBytes)
	}
	zr, err := zip.NewReader(ra, size)
	// ErrInsecurePath comes with a usable reader; our own name checks
	// refuse such names with a precise message.
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return zipError("Uploaded file must be a valid .zip archive").Wrap(err)
	}
	entries, err := checkArchive(zr, size, lim)
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return boxerr.Failure("open extraction dir: %v", err).Wrap(err)
	}
	defer root.Close()
	total := lim.MaxZipTotalBytes
	buf := make([]byte, zipPiece)
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.dir {
			if err := root.MkdirAll(e.rel, 0o755); err != nil {
				return zipError("Archive entry %q cannot be extracted: %v", e.f.Name, err).Wrap(err)
			}
			continue
		}
		if d := path.Dir(e.rel); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return zipError("Archive entry %q cannot be extracted: %v", e.f.Name, err).Wrap(err)
			}
		}
		n, err := extractEntry(ctx, root, e, lim, total, buf)
		if err != nil {
			return err
		}
		total -= n
	}
	return nil
}

// extractEntry streams one file entry; budget is what the total limit
// still allows. It returns the bytes written.
func extractEntry(ctx context.Context, root *os.Root, e zipEntry, lim Limits, budget int64, buf []byte) (int64, error) {
	mode := fs.FileMode(0o644)
	if e.exec {
		mode = 0o755
	}
	// O_EXCL: a second entry can never overwrite the first (duplicates
	// are refused earlier; this is the belt to those braces).
	out, err := root.OpenFile(e.rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return 0, zipError("Archive entry %q cannot be extracted: %v", e.f.Name, err).Wrap(err)
	}
	defer out.Close()
	raw, err := e.f.OpenRaw()
	if err != nil {
		return 0, zipError("Archive entry %q is corrupt: %v", e.f.Name, err).Wrap(err)
	}
	// Decompress ourselves from the raw bytes instead of zip.File.Open, so
	// every size decision below is ours and made on real output.
	var src io.Reader = raw
	if e.f.Method == zip.Deflate {
		fr := flate.NewReader(raw)
		defer fr.Close()
		src = fr
	}
	declared := int64(e.f.UncompressedSize64)
	crc := crc32.NewIEEE()
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, rerr := src.Read(buf)
		n += int64(k)
		switch {
		case n > declared:
			return n, zipError("Archive entry %q is larger than its declared size (%d bytes)", e.f.Name, declared)
		case n > lim.MaxZipEntryBytes:
			return n, zipError("Archive entry %q exceeds the uncompressed size limit (%d bytes)", e.f.Name, lim.MaxZipEntryBytes)
		case n > budget:
			return n, zipError("Uploaded archive exceeds the total uncompressed size limit (%d bytes)", lim.MaxZipTotalBytes)
		}
		if k > 0 {
			crc.Write(buf[:k])
			if _, err := out.Write(buf[:k]); err != nil {
				return n, boxerr.Failure("extract %q: %v", e.f.Name, err).Wrap(err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return n, zipError("Archive entry %q is corrupt: %v", e.f.Name, rerr).Wrap(rerr)
		}
	}
	if n != declared {
		return n, zipError("Archive entry %q is smaller than its declared size (%d of %d bytes)", e.f.Name, n, declared)
	}
	if crc.Sum32() != e.f.CRC32 {
		return n, zipError("Archive entry %q fails its CRC-32 check", e.f.Name)
	}
	if err := out.Chmod(mode); err != nil {
		return n, boxerr.Failure("extract %q: %v", e.f.Name, err).Wrap(err)
	}
	if err := out.Close(); err != nil {
		return n, boxerr.Failure("extract %q: %v", e.f.Name, err).Wrap(err)
	}
	return n, nil
}

// describe is used in messages listing source paths: the root is ".".
func describe(sourcePath string) string {
	if sourcePath == "" {
		return "."
	}
	return sourcePath
}
