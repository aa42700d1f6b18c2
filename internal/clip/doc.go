// Package clip shortens text for logs and error messages. It is a leaf
// (it imports nothing of boxrt) so the runtime, the method catalogue, the
// CLI and the bench harness all cut text the same way.
package clip
