package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes where the numbers come from.
type Machine struct {
	CPU       string
	Cores     int
	MemTotal  string
	Kernel    string
	OS        string
	Docker    string
	Bwrap     string
	GoVersion string
	Commit    string
	Date      time.Time
	Cgroup    string
}

// collectMachine describes the machine; the commit is the work tree's
// (the harness runs from the repository root).
func collectMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), Date: time.Now().UTC()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(rest)
				if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
					m.MemTotal = strconv.FormatFloat(kb/1024/1024, 'f', 1, 64) + " GiB"
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	m.Docker = cmdOut("docker", "version", "--format", "engine {{.Server.Version}} (API {{.Server.APIVersion}}), CLI {{.Client.Version}}")
	m.Bwrap = cmdOut("bwrap", "--version")
	if gv := cmdOut("go", "version"); gv != "" && !strings.HasPrefix(gv, "unavailable") {
		m.GoVersion = gv + " (bench binary built with " + runtime.Version() + ")"
	}
	m.Commit = cmdOut("git", "describe", "--always", "--dirty", "--abbrev=12")
	if fs := cmdOut("stat", "-fc", "%T", "/sys/fs/cgroup"); fs == "cgroup2fs" {
		m.Cgroup = "v2"
	} else if fs != "" {
		m.Cgroup = "v1 (" + fs + " at /sys/fs/cgroup)"
	}
	return m
}

// cmdOut runs a command (10 s at most) and returns its trimmed output, or
// "unavailable: …".
func cmdOut(name string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		if s == "" {
			s = err.Error()
		}
		return "unavailable: " + firstLine(s)
	}
	return firstLine(s)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Noise is how steady the machine was.
type Noise struct {
	Waited                string // what -wait-quiet found
	Before, After         Calibration
	LoadBefore, LoadAfter string
	StatBefore, StatAfter cpuStat
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unavailable"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return strings.TrimSpace(string(b))
	}
	return strings.Join(f[:3], " ")
}

// cpuStat is the aggregate "cpu" line of /proc/stat, in ticks.
type cpuStat struct {
	total, idle, steal, iowait uint64
}

func readCPUStat() cpuStat {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuStat{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuStat{}
	}
	var s cpuStat
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		if i < 8 { // user nice system idle iowait irq softirq steal
			s.total += n
		}
		switch i {
		case 3:
			s.idle = n
		case 4:
			s.iowait = n
		case 7:
			s.steal = n
		}
	}
	return s
}

// stealPct is the share of CPU time the hypervisor took between two reads.
func stealPct(a, b cpuStat) float64 {
	dt := float64(b.total - a.total)
	if dt <= 0 {
		return 0
	}
	return 100 * float64(b.steal-a.steal) / dt
}

func busyPct(a, b cpuStat) float64 {
	dt := float64(b.total - a.total)
	if dt <= 0 {
		return 0
	}
	return 100 * (1 - float64((b.idle+b.iowait)-(a.idle+a.iowait))/dt)
}

// waitQuiet waits until the CPUs were under 20% busy over a 5 s window,
// or gives up after limit; it says which.
func (b *bench) waitQuiet(ctx context.Context, limit time.Duration) string {
	deadline := time.Now().Add(limit)
	start := time.Now()
	for {
		a := readCPUStat()
		select {
		case <-ctx.Done():
			return "interrupted"
		case <-time.After(5 * time.Second):
		}
		busy := busyPct(a, readCPUStat())
		if busy < 20 {
			return fmt.Sprintf("waited %s for the machine to be idle (%.0f%% busy over 5 s)", time.Since(start).Round(time.Second), busy)
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("waited %s for an idle machine and gave up (still %.0f%% busy over 5 s)", limit, busy)
		}
		b.logf("machine %.0f%% busy; waiting for it to be idle", busy)
	}
}
