package clip

import (
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	tests := []struct {
		name, in string
		n        int
		want     string
	}{
		{"short stays", "abc", 3, "abc"},
		{"empty", "", 0, ""},
		{"ascii cut", "abcdef", 3, "abc…"},
		{"cut on a rune boundary", "añb", 3, "añ…"},
		// "ñ" is two bytes: a cut after its first byte backs off to before it.
		{"cut inside a two-byte rune", "añb", 2, "a…"},
		{"cut inside a four-byte rune", "x😀y", 3, "x…"},
		{"nothing fits", "😀", 2, "…"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := String(tc.in, tc.n)
			if got != tc.want {
				t.Errorf("String(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
			if !utf8.ValidString(got) {
				t.Errorf("String(%q, %d) = %q is not valid UTF-8", tc.in, tc.n, got)
			}
		})
	}
}

func TestMiddle(t *testing.T) {
	tests := []struct {
		name, in string
		n        int
		want     string
	}{
		{"short stays", "abcdef", 6, "abcdef"},
		{"head and tail kept", "abcdefghij", 4, "ab…ij"},
		{"odd budget favours the head", "abcdefghij", 5, "abc…ij"},
		// "ñ" is two bytes: neither side keeps half of it.
		{"cut inside a rune on both sides", "añbcdñe", 4, "a…e"},
		{"nothing fits", "abc", 0, "…"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Middle(tc.in, tc.n)
			if got != tc.want {
				t.Errorf("Middle(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
			if !utf8.ValidString(got) {
				t.Errorf("Middle(%q, %d) = %q is not valid UTF-8", tc.in, tc.n, got)
			}
		})
	}
}
