// Package envd holds envd's wire: the .proto files of the process and
// filesystem services the E2B SDKs call inside a sandbox, and the Go code
// scripts/gen-e2b generates from them (process, filesystem and their
// *connect packages). Nothing here is written by hand but the .proto files.
package envd
