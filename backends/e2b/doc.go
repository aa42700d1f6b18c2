// Package e2b runs boxrt sessions on an E2B-compatible endpoint: E2B's
// cloud, a self-hosted E2B, or another boxrt serving E2B's API
// (internal/e2bapi). A session is one E2B sandbox, made and ended through
// the control API (api_url, the API key as X-API-Key); commands, managed
// processes and files go to the sandbox's envd (Connect RPC
// process.Process and filesystem.Filesystem, plain HTTP /files) with the
// sandbox's access token, at sandbox_url or at E2B's
// https://49983-<id>.<domain>.
//
// The endpoint and its sandboxes are remote and untrusted: every answer is
// bounded (control bodies, Connect messages, a stream's idle time, a
// download's length) and validated (ids, tokens, pids, exit codes), every
// call has a deadline, and every goroutine a command or process starts
// ends with it. What boxrt needs and E2B lacks (host directories, signals
// other than KILL and TERM, archives) is a typed refusal or a documented
// approximation (docs/protocol.md, "The e2b backend").
package e2b
