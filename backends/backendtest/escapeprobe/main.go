// Command escapeprobe tries, from inside a sandbox, one thing a sandbox
// must not be able to do, and prints what happened as key=value lines. It
// is built static by the escape tests (backendtest.RunEscapeTests) and
// bound read-only into the sandbox; it decides nothing itself: the test
// on the host judges the output.
package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: escapeprobe read|write|mount|unshare|rawsock|connect|ptrace|forkbomb|memhog …")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "read":
		b, err := os.ReadFile(args[0])
		report("read", err)
		os.Stdout.Write(b)
	case "write":
		for _, p := range args {
			report("write "+p, os.WriteFile(p, []byte("escaped\n"), 0o644))
		}
	case "mount":
		dir := filepath.Join(os.TempDir(), "escapeprobe-mnt")
		_ = os.MkdirAll(dir, 0o755)
		report("mount tmpfs", unix.Mount("none", dir, "tmpfs", 0, ""))
		report("mount proc", unix.Mount("proc", dir, "proc", 0, ""))
	case "unshare":
		for _, f := range []struct {
			name  string
			flags int
		}{{"user", unix.CLONE_NEWUSER}, {"mount", unix.CLONE_NEWNS}, {"net", unix.CLONE_NEWNET}} {
			report("unshare "+f.name, unshareChild(f.flags))
		}
	case "rawsock":
		for _, s := range []struct {
			name        string
			domain, typ int
			proto       int
		}{{"inet raw", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}, {"packet", unix.AF_PACKET, unix.SOCK_RAW, 0x0300}} {
			fd, err := unix.Socket(s.domain, s.typ, s.proto)
			if err == nil {
				unix.Close(fd)
			}
			report("socket "+s.name, err)
		}
	case "connect":
		c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
		if err == nil {
			c.Close()
		}
		report("connect "+args[0], err)
	case "ptrace":
		// The marker comes in two halves so that this probe's own command
		// line (and its shell's) does not contain it.
		ptrace(args[0]+args[1], args[2:])
	case "forkbomb":
		n, _ := strconv.Atoi(args[0])
		forkbomb(n)
	case "memhog":
		mb, _ := strconv.Atoi(args[0])
		var keep [][]byte
		for i := 0; i < mb; i += 8 {
			b := make([]byte, 8<<20)
			for j := range b {
				if j%4096 == 0 {
					b[j] = 1
				}
			}
			keep = append(keep, b)
		}
		fmt.Printf("allocated=%d\n", len(keep)*8)
	default:
		fmt.Fprintln(os.Stderr, "unknown probe", os.Args[1])
		os.Exit(2)
	}
}

// report prints "<what>=ok" when the attempt worked, else the error.
func report(what string, err error) {
	if err == nil {
		fmt.Printf("%s=ok\n", what)
		return
	}
	fmt.Printf("%s=denied (%v)\n", what, err)
}

// unshareChild unshares in a child process (a Go program cannot unshare a
// user namespace once threaded), via the clone flags of a re-exec of
// /bin/true.
func unshareChild(flags int) error {
	cmd := exec.Command("/bin/true")
	if _, err := os.Stat("/bin/true"); err != nil {
		cmd = exec.Command("/bin/sh", "-c", "true")
	}
	cmd.SysProcAttr = &unix.SysProcAttr{Cloneflags: uintptr(flags)}
	return cmd.Run()
}

// ptrace looks for a process whose command line contains marker (another
// session's), first among the pids this sandbox can see, then at the host
// pids given, and tries to attach to it.
func ptrace(marker string, hostPids []string) {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	for _, s := range hostPids {
		if pid, err := strconv.Atoi(s); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	seen := false
	for _, pid := range pids {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte(marker)) || pid == os.Getpid() {
			continue
		}
		seen = true
		fmt.Printf("visible=%d %s\n", pid, strings.ReplaceAll(string(cmdline), "\x00", " "))
		err = unix.PtraceAttach(pid)
		if err == nil {
			_ = unix.PtraceDetach(pid)
		}
		report(fmt.Sprintf("ptrace %d", pid), err)
	}
	if !seen {
		fmt.Println("visible=none")
	}
}

// forkbomb starts up to n sleeping children and reports how many it got
// before the kernel refused, then kills them.
func forkbomb(n int) {
	var procs []*exec.Cmd
	var err error
	for len(procs) < n {
		cmd := exec.Command("sleep", "120")
		if err = cmd.Start(); err != nil {
			break
		}
		procs = append(procs, cmd)
	}
	fmt.Printf("started=%d\n", len(procs))
	report("fork", err)
	for _, c := range procs {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
}
