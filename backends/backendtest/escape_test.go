package backendtest

import (
	"testing"

	"github.com/boxrt/boxrt/backends"
)

// TestEscapeCasesNeedTheProbesWord: every escape case fails when its
// probe did not run (no output, or the shell's "not found"), on a kernel
// shared with the host and on one of the sandbox's own; a case passes
// only on the probe's "=denied" line or the limit's kill.
func TestEscapeCasesNeedTheProbesWord(t *testing.T) {
	h := &host{writes: []string{"/nonexistent-boxrt-escape/a"}, listener: "127.0.0.1:9", marker: "31123456"}
	silent := map[string]outcome{
		"no output":   {},
		"not found":   {out: "sh: " + ProbeDir + "/escapeprobe: not found\n", status: backends.ExitStatus{ExitCode: 127}},
		"other lines": {out: "hello\n"},
	}
	for _, shared := range []bool{true, false} {
		for _, tc := range escapeCases {
			for name, o := range silent {
				if got := tc.escaped(Env{KernelShared: shared}, h, o); got == "" {
					t.Errorf("%s (kernel shared %v), probe %s: passed", tc.name, shared, name)
				}
			}
		}
	}
}

// TestEscapeCasesPassOnDenied: the probe's real "=denied" answers pass.
func TestEscapeCasesPassOnDenied(t *testing.T) {
	h := &host{writes: []string{"/nonexistent-boxrt-escape/a"}, listener: "127.0.0.1:9", marker: "31123456"}
	outs := map[string]outcome{
		"read host /etc/shadow":                  {out: "read=denied (permission denied)\n"},
		"write outside the workspace":            {out: "write /nonexistent-boxrt-escape/a=denied (read-only file system)\n"},
		"mount":                                  {out: "mount tmpfs=denied (operation not permitted)\nmount proc=denied (operation not permitted)\n"},
		"unshare":                                {out: "unshare user=denied (x)\nunshare mount=denied (x)\nunshare net=denied (x)\n"},
		"raw sockets":                            {out: "socket inet raw=denied (x)\nsocket packet=denied (x)\n"},
		"vsock socket":                           {out: "socket vsock=denied (address family not supported by protocol)\n"},
		"reach a host listener with network off": {out: "connect 127.0.0.1:9=denied (network is unreachable)\n"},
		"fork bomb under the pids limit":         {out: "started=29\nfork=denied (resource temporarily unavailable)\n"},
		"memory hog under the memory limit":      {out: "memhog=start\n", status: backends.ExitStatus{ExitCode: 137}},
		"ptrace of another session's process":    {out: "visible=none\n"},
	}
	for _, tc := range escapeCases {
		o, ok := outs[tc.name]
		if !ok {
			t.Errorf("%s: no denied outcome in this test", tc.name)
			continue
		}
		if got := tc.escaped(Env{KernelShared: true}, h, o); got != "" {
			t.Errorf("%s: %s", tc.name, got)
		}
	}
}
