// Package egress owns a session's way out to the network when its policy is
// more than "off": the policy language (Parse), the configuration of the
// session's network namespace (Attach: loopback, a default route into
// loopback, nftables rules that send every TCP connection to the proxy and
// every DNS query to the resolver and drop the rest), the proxy that decides
// each connection by name and address and dials out from boxrt's own
// namespace, the DNS resolver that answers only allowed names, and the
// secrets the proxy puts into requests for their hosts (terminating TLS with
// a per-session CA for those hosts only).
//
// One Proxy serves every session; a Session is one network namespace's
// state: its listeners (made inside the namespace by boxrt, so nothing runs
// in the sandbox), its policy, its DNS memory, its live connections and its
// counters. Everything the sandbox sends is hostile: peeks, names, DNS
// queries and connection counts are bounded, and no secret value appears in
// an error, a log line or a counter.
package egress
