package agenttest_test

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/internal/sandboxagent"
	"github.com/boxrt/boxrt/internal/sandboxagent/agenttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBinary: the binary is static, is built once, and works as the
// agent through the boxrt agent command.
func TestBinary(t *testing.T) {
	bin := agenttest.Binary(t)
	if again := agenttest.Binary(t); again != bin {
		t.Errorf("second call: %s, first %s", again, bin)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a program interpreter: it is dynamically linked")
		}
	}
	f.Close()

	help, err := exec.Command(bin, "agent", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(help), "run by boxrt itself") {
		t.Errorf("boxrt agent --help: %v\n%s", err, help)
	}
	if top, _ := exec.Command(bin, "--help").CombinedOutput(); strings.Contains(string(top), "\n   agent ") {
		t.Errorf("boxrt --help lists the hidden agent command:\n%s", top)
	}

	dir := t.TempDir()
	l, err := sandboxagent.Listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	agent := exec.Command(bin, "agent", "--connect", filepath.Join(dir, sandboxagent.SocketName))
	agent.Stderr = os.Stderr
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { agent.Process.Kill(); agent.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Spawn(ctx, sandboxagent.SpawnRequest{Argv: []string{"sh", "-c", "exit 4"}, Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := p.Wait(ctx); err != nil || e.Code != 4 {
		t.Errorf("exit %+v, %v; want code 4", e, err)
	}
}
