// Package snapshots stores session snapshots: a JSON manifest (what the
// snapshot is of: the source session, its backend, its sandbox spec) plus
// one archive, the session's files as a tar stream (entries under the
// backends.Archive* prefixes), compressed with zstd.
//
// Store is the interface the runtime uses; Local, a directory on the
// host, is the default implementation:
//
//	<dir>/blobs/sha256/<hex>.tar.zst   archives, named by the SHA-256 of their compressed bytes
//	<dir>/manifests/<snapshot id>.json manifests (digest, sizes, spec)
//	<dir>/tmp/                         archives and manifests being written
//
// Everything is written to tmp/ and renamed into place, the blob before the
// manifest that names it: a kill -9 mid-snapshot leaves at most an
// unreferenced temp file (removed on the next open), never a manifest
// whose archive is missing or short. Blobs are content-addressed, so two
// snapshots of identical files share one; a blob goes with the last
// manifest that names it. Every Open verifies the archive's digest before
// handing out a byte, and a mismatch is BoxSnapshotCorruptedError; zstd's
// frame checksums catch the rest while decoding. The total size of the
// blobs is bounded (OpenLocal's maxBytes): a Put that would pass it fails with
// BoxCapacityExceededError naming the limit, and leaves nothing behind.
//
// An object store (S3-compatible) implements Store with the same two kinds
// of keys: blobs/sha256/<hex> written once with a checksum the service
// verifies (Content-MD5 / x-amz-checksum-sha256) and manifests/<id>.json
// written after their blob, so a reader never sees a manifest before its
// archive; Open must verify the digest as Local does.
package snapshots
