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
