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
//
// What a backend does with a session (the wiring, not in this package):
// Attach it with the namespace and the spec's policy and secrets; give the
// sandbox a resolv.conf naming any address that is not loopback (port 53
// anywhere reaches the resolver; 127.0.0.0/8 stays the sandbox's own);
// add Session.Env and, when CABundle is not nil, write it into the
// sandbox and add TrustEnv of its path; Update on box_update_network;
// Close at the session's end.
package egress
