package procstat

import (
	"os"
	"testing"
)

func TestOOMKills(t *testing.T) {
	if n := OOMKills(os.Getpid()); n < 0 {
		t.Fatalf("OOMKills of this process = %d: its memory cgroup's counter was not found", n)
	}
	if n := OOMKills(-1); n != -1 {
		t.Fatalf("OOMKills of no process = %d, want -1", n)
	}
}
