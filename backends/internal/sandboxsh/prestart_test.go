package sandboxsh

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrestartLine runs PrestartScript under the shells images ship as sh
// (dash, busybox ash, bash) and hands it its arguments with PrestartLine:
// whatever the command holds must reach `sh -lc` byte for byte.
func TestPrestartLine(t *testing.T) {
	payload := `it's "quoted" $HOME ` + "`id` \\ \\n '\"$bk_nl\"' tab\there  "
	scenarios := []struct {
		name     string
		workdir  string // under a temp dir
		cmd      string
		noLogin  bool
		noLine   bool
		wantOut  string // "{wd}" is the workdir
		wantCode int
	}{
		{name: "quotes, expansions and backslashes reach the command as written",
			workdir: "w", cmd: "cat <<'EOF'\n" + payload + "\nEOF", wantOut: payload + "\n"},
		{name: "a workdir with a quote and a newline is made and entered",
			workdir: "it's\nhere", cmd: "pwd", wantOut: "{wd}\n"},
		{name: "the command's exit status is the exec's",
			workdir: "w", cmd: "echo out; exit 7", wantOut: "out\n", wantCode: 7},
		{name: "the login shell reads the profile",
			workdir: "w", cmd: "echo ${PROFILE:--}", wantOut: "read\n"},
		{name: "a command that is its own login shell runs without it (NoLogin)",
			workdir: "w", cmd: "echo ${PROFILE:--}", noLogin: true, wantOut: "-\n"},
		{name: "EOF before a line ends it quietly", noLine: true},
	}
	for _, sh := range shells(t) {
		for _, sc := range scenarios {
			t.Run(filepath.Base(sh[0])+"/"+sc.name, func(t *testing.T) {
				dir := t.TempDir()
				wd, pidFile := filepath.Join(dir, sc.workdir), filepath.Join(dir, "pid")
				if err := os.WriteFile(filepath.Join(dir, ".profile"), []byte("PROFILE=read\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(sh[0], append(sh[1:], "-c", PrestartScript, "boxrt-exec")...)
				cmd.Env = append(os.Environ(), "HOME="+dir) // a login shell reads $HOME/.profile
				var out, errOut bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &errOut
				stdin, err := cmd.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				if !sc.noLine {
					line, ok := PrestartLine(wd, sc.cmd, pidFile, "", ShellFlags(sc.noLogin))
					if !ok {
						t.Fatal("PrestartLine refused the arguments")
					}
					if _, err := stdin.Write(line); err != nil {
						t.Fatal(err)
					}
				} else {
					stdin.Close()
				}
				err = cmd.Wait() // closes stdin: the watcher's EOF
				code := 0
				var exitErr *exec.ExitError
				if errors.As(err, &exitErr) {
					code = exitErr.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				want := strings.ReplaceAll(sc.wantOut, "{wd}", wd)
				if out.String() != want || code != sc.wantCode {
					t.Fatalf("got %q, exit %d (stderr %q); want %q, exit %d", out.String(), code, errOut.String(), want, sc.wantCode)
				}
			})
		}
	}
}

func TestPrestartLineRefuses(t *testing.T) {
	for _, sc := range []struct {
		name string
		args []string
	}{
		{"a NUL byte", []string{"/w", "echo a\x00b"}},
		{"a command too long to read a byte at a time", []string{"/w", strings.Repeat("x", prestartLineMax)}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			if _, ok := PrestartLine(sc.args...); ok {
				t.Fatal("PrestartLine accepted it")
			}
		})
	}
}

// shells are the sh implementations on this machine (scripts/setup
// installs busybox-static; /bin/sh is dash on Debian).
func shells(t *testing.T) [][]string {
	out := [][]string{{"/bin/sh"}}
	if p, err := exec.LookPath("bash"); err == nil {
		out = append(out, []string{p, "--posix"})
	}
	if p, err := exec.LookPath("busybox"); err == nil {
		out = append(out, []string{p, "sh"})
	} else {
		t.Log("busybox is not installed (scripts/setup installs it): ash is not tested")
	}
	return out
}
