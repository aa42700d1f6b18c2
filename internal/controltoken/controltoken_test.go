package controltoken

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		tok, wantErr string
	}{
		{Random(), ""},
		{strings.Repeat("é", MinLen), ""},
		{strings.Repeat("x", MinLen-1), "is 31 characters long"},
		{strings.Repeat("x", MinLen) + " y", "must not contain whitespace"},
	} {
		err := Check("BOXRT_CONTROL_TOKEN", tc.tok)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("Check(%q) = %v", tc.tok, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "BOXRT_CONTROL_TOKEN: ")):
			t.Errorf("Check(%q) = %v, want an error naming its source and %q", tc.tok, err, tc.wantErr)
		}
	}
}

// A generated token survives a restart only in a private file: one that
// others can read may be known to them.
func TestFileIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", FileName)
	tok := Random()
	if err := WriteFile(path, tok); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadFile(path, true); err != nil || got != tok {
		t.Fatalf("ReadFile = %q, %v; want the token written", got, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path, true); err == nil {
		t.Error("a file others can read was accepted as private")
	}
	if got, err := ReadFile(path, false); err != nil || got != tok {
		t.Errorf("a client reads it anyway: got %q, %v", got, err)
	}
}
