package clip

import "unicode/utf8"

// String returns s when it is at most n bytes long, else its first n bytes
// or fewer, never splitting a UTF-8 sequence, followed by "…".
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Middle returns s when it is at most n bytes long, else about its first
// and last n/2 bytes with "…" between them, never splitting a UTF-8
// sequence: for an error whose cause comes last, after long paths.
func Middle(s string, n int) string {
	if len(s) <= n {
		return s
	}
	tail := len(s) - n/2
	for tail < len(s) && !utf8.RuneStart(s[tail]) {
		tail++
	}
	return String(s, n-n/2) + s[tail:]
}
