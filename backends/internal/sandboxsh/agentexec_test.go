package sandboxsh

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestAgentExecArgv runs the agent's argv under the host's sh: it makes
// and enters the workdir, and the command's shell reads the profile
// unless the command is its own login shell (NoLogin).
func TestAgentExecArgv(t *testing.T) {
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, ".profile"), []byte("PROFILE=read\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		noLogin bool
		want    string
	}{{false, "read"}, {true, "-"}} {
		workdir := filepath.Join(t.TempDir(), "made", "here")
		argv := AgentExecArgv(workdir, `echo "${PROFILE:--} $(pwd) $1"`, tc.noLogin)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("noLogin %v: %v", tc.noLogin, err)
		}
		if got, want := string(out), tc.want+" "+workdir+" \n"; got != want {
			t.Errorf("noLogin %v: got %q, want %q", tc.noLogin, got, want)
		}
		if argv[len(argv)-1] != `echo "${PROFILE:--} $(pwd) $1"` {
			t.Errorf("the command is not the last argument (the agent carries only that one apart, however long): %q", argv)
		}
	}
}
