// Package atomicfile writes state files so that a reader only ever sees the
// old content or the whole new one: through a temporary file beside the
// target, synced, then renamed over it. A failed write (a full disk above
// all) removes its temporary file, so nothing half-written stays behind.
// It is a leaf (it imports nothing of boxrt), shared by the runtime and the
// backends, which must not import each other.
package atomicfile
