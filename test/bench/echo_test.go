package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestCopyExecutable(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	content := []byte("#!/bin/sh\necho peer\n")
	if err := os.WriteFile(src, content, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		src     string
		wantErr bool
	}{
		{name: "copies the bytes, executable", src: src},
		{name: "missing source leaves nothing", src: filepath.Join(dir, "no-such-file"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := t.TempDir()
			dst := filepath.Join(out, "echo-peer-baseline")
			err := copyExecutable(tt.src, dst)
			if (err != nil) != tt.wantErr {
				t.Fatalf("copyExecutable: err = %v, want error %v", err, tt.wantErr)
			}
			entries, _ := os.ReadDir(out)
			if tt.wantErr {
				if len(entries) != 0 {
					t.Fatalf("a failed copy left %d files behind", len(entries))
				}
				return
			}
			if len(entries) != 1 {
				t.Fatalf("want only the copy in the directory, found %d entries", len(entries))
			}
			got, err := os.ReadFile(dst)
			if err != nil || !bytes.Equal(got, content) {
				t.Fatalf("copy holds %q (%v), want %q", got, err, content)
			}
			if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o755 {
				t.Fatalf("copy mode %v, want 0755", fi.Mode().Perm())
			}
		})
	}
}
