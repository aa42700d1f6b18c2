package procstat

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNet(t *testing.T) {
	dev := `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 9000      10    0    0    0     0          0         0     9000      10    0    0    0     0       0          0
  eth0: 1500       3    0    0    0     0          0         0      700       2    0    0    0     0       0          0
   tap0:  25       1    0    0    0     0          0         0       50       1    0    0    0     0       0          0
  bad: x y
`
	p := filepath.Join(t.TempDir(), "dev")
	if err := os.WriteFile(p, []byte(dev), 0o600); err != nil {
		t.Fatal(err)
	}
	if rx, tx := Net(p); rx != 1525 || tx != 750 {
		t.Fatalf("Net = %d, %d; want 1525, 750 (lo and malformed lines left out)", rx, tx)
	}
	if rx, tx := Net(filepath.Join(t.TempDir(), "none")); rx != 0 || tx != 0 {
		t.Fatalf("a missing file reads %d, %d", rx, tx)
	}
}

func TestOOMKills(t *testing.T) {
	if n := OOMKills(os.Getpid()); n < 0 {
		t.Fatalf("OOMKills of this process = %d: its memory cgroup's counter was not found", n)
	}
	if n := OOMKills(-1); n != -1 {
		t.Fatalf("OOMKills of no process = %d, want -1", n)
	}
}
