package clip

import (
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	tests := []struct {
		name, fn, in string
		n            int
		want         string
	}{
		{"short stays", "String", "abc", 3, "abc"},
		{"empty", "String", "", 0, ""},
		{"ascii cut", "String", "abcdef", 3, "abc…"},
		{"cut on a rune boundary", "String", "añb", 3, "añ…"},
		// "ñ" is two bytes: a cut after its first byte backs off to before it.
		{"cut inside a two-byte rune", "String", "añb", 2, "a…"},
		{"cut inside a four-byte rune", "String", "x😀y", 3, "x…"},
		{"nothing fits", "String", "😀", 2, "…"},
		{"middle: short stays", "Middle", "abcdef", 6, "abcdef"},
		{"middle: head and tail kept", "Middle", "abcdefghij", 4, "ab…ij"},
		{"middle: odd budget favours the head", "Middle", "abcdefghij", 5, "abc…ij"},
		// Neither side keeps half of a "ñ".
		{"middle: cut inside a rune on both sides", "Middle", "añbcdñe", 4, "a…e"},
		{"middle: nothing fits", "Middle", "abc", 0, "…"},
	}
	clips := map[string]func(string, int) string{"String": String, "Middle": Middle}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := clips[tc.fn](tc.in, tc.n)
			if got != tc.want {
				t.Errorf("%s(%q, %d) = %q, want %q", tc.fn, tc.in, tc.n, got, tc.want)
			}
			if !utf8.ValidString(got) {
				t.Errorf("%s(%q, %d) = %q is not valid UTF-8", tc.fn, tc.in, tc.n, got)
			}
		})
	}
}
