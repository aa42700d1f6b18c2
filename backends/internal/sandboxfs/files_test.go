package sandboxfs

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// TestScriptError: the script's "<param>|<kind>: <detail>" lines map to
// typed errors naming the parameter at fault.
func TestScriptError(t *testing.T) {
	params := []string{"from", "/workspace/a", "to", "/tmp/b"}
	for _, tc := range []struct {
		name      string
		code      int
		msg       string
		kind      *boxerr.Kind
		field     string
		wantInMsg string
	}{
		{"not found", 3, "from|notfound: /workspace/a", boxerr.ErrFileNotFound, "", "/workspace/a"},
		{"outside names its param", 3, "to|outside: /etc/b", boxerr.ErrValidation, "to", "/etc/b"},
		{"read-only", 3, "to|readonly: /tmp/b", boxerr.ErrValidation, "to", "read-only"},
		{"cross-mount rename", 3, "to|xdev: /tmp/b", boxerr.ErrValidation, "to", "another mount"},
		{"not empty", 3, "from|notempty: /workspace/a", boxerr.ErrValidation, "from", "not empty"},
		{"unresolvable link", 3, "to|unresolvable: /tmp/b", boxerr.ErrValidation, "to", "cannot be resolved"},
		{"unknown kind", 3, "from|failed: mv: oops", boxerr.ErrBox, "", "mv: oops"},
		{"script crashed", 2, "sh: syntax error", boxerr.ErrBox, "", "exited with 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := scriptError("kube backend", params, tc.code, tc.msg)
			var be *boxerr.Error
			if !errors.As(err, &be) || be.Kind != tc.kind {
				t.Fatalf("want %s, got %T %v", tc.kind.Type, err, err)
			}
			if tc.field != "" && be.Details["field"] != tc.field {
				t.Errorf("field = %v, want %s (%v)", be.Details["field"], tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.wantInMsg) {
				t.Errorf("message %q lacks %q", err.Error(), tc.wantInMsg)
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	f := FS{Backend: "test"}
	for _, tc := range []struct {
		line string
		want backends.FileInfo
		bad  bool
	}{
		{line: "81a4 6 1700000000", want: backends.FileInfo{Name: "f", Path: "/w/f", Type: backends.FileTypeFile, Size: 6, Mode: 0o644, MTime: time.Unix(1700000000, 0).UTC()}},
		{line: "41ed 4096 0", want: backends.FileInfo{Name: "f", Path: "/w/f", Type: backends.FileTypeDir, Size: 4096, Mode: 0o755, MTime: time.Unix(0, 0).UTC()}},
		{line: "a1ff 11 0", want: backends.FileInfo{Name: "f", Path: "/w/f", Type: backends.FileTypeSymlink, Size: 11, Mode: 0o777, MTime: time.Unix(0, 0).UTC()}},
		{line: "11a4 0 0", want: backends.FileInfo{Name: "f", Path: "/w/f", Type: backends.FileTypeOther, Mode: 0o644, MTime: time.Unix(0, 0).UTC()}},
		{line: "81a4 6", bad: true},
		{line: "zz 6 0", bad: true},
	} {
		got, err := f.parseStat("f", "/w/f", tc.line)
		if tc.bad {
			if !errors.Is(err, boxerr.ErrBox) {
				t.Errorf("%q: want a failure, got %+v %v", tc.line, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %+v %v, want %+v", tc.line, got, err, tc.want)
		}
	}
}

func TestCommandEncodesEveryByte(t *testing.T) {
	cmd := Command(backends.Session{Sandbox: backends.Sandbox{MountPath: "/workspace"}}, "read", "/workspace/caf\xe9 x")
	want := []string{"sh", "-c", Script, "boxrt-fs", shellArg("read"), shellArg("rw:/tmp"), shellArg("rw:/workspace"), shellArg("--"), shellArg("/workspace/caf\xe9 x")}
	if len(cmd) != len(want) {
		t.Fatalf("got %q", cmd)
	}
	for i := range want {
		if cmd[i] != want[i] {
			t.Fatalf("argument %d: got %q, want %q", i, cmd[i], want[i])
		}
	}
	if got := shellArg("a\xe9"); got != `\141\351` {
		t.Errorf("shellArg = %q", got)
	}
}
