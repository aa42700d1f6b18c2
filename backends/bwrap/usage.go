package bwrap

import (
	"context"
	"io/fs"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/loopdisk"
)

// maxUsageWalk bounds the entries a disk measurement of a session without
// its own disk visits.
const maxUsageWalk = 200000

// SessionUsage measures the session from its cgroup (CPU, memory,
// processes, OOM kills), its disk and its sandbox's network namespace.
func (b *Backend) SessionUsage(_ context.Context, info backends.Session) (backends.Usage, error) {
	dir, err := b.lookup(info)
	if err != nil {
		return backends.Usage{}, err
	}
	b.mu.Lock()
	sf := b.open[info.BackendSessionID]
	b.mu.Unlock()
	var u backends.Usage
	var cg *cgroup
	var m *machine
	stage := ""
	if sf != nil {
		sf.mu.Lock()
		cg, stage = sf.cg, sf.stage
		sf.mu.Unlock()
		sf.res.mu.Lock()
		if sf.res.conn != nil {
			m = &machine{r: sf.res.r, conn: sf.res.conn}
		}
		sf.res.mu.Unlock()
	}
	if cg != nil {
		cg.usage(&u)
	}
	if m != nil && m.alive() {
		u.Processes = m.countUserProcesses()
	}
	b.diskUsage(&u, dir, stage, info)
	return u, nil
}

// usage reads CPU, memory and OOM kills from the cgroup's files (v1 or v2).
func (cg *cgroup) usage(u *backends.Usage) {
	if cg.m.version == cgroupV2 {
		u.CPUSeconds = float64(cg.counter("cpu.stat", "usage_usec")) / 1e6
		u.MemoryBytes = cg.value("memory.current")
		u.MemoryPeakBytes = cg.value("memory.peak")
		u.MemoryLimitBytes = cg.value("memory.max")
	} else {
		u.CPUSeconds = float64(cg.value("cpuacct.usage")) / 1e9
		u.MemoryBytes = cg.value("memory.usage_in_bytes")
		u.MemoryPeakBytes = cg.value("memory.max_usage_in_bytes")
		if lim := cg.value("memory.limit_in_bytes"); lim < 1<<60 {
			u.MemoryLimitBytes = lim
		}
	}
	u.OOMKills = cg.oomKills()
}

// value reads a one-number cgroup file from the first hierarchy that has
// it; 0 when none does ("max" reads as 0: no limit).
func (cg *cgroup) value(file string) int64 {
	for _, d := range cg.dirs {
		for _, w := range readWords(filepath.Join(d, file)) {
			if n, err := strconv.ParseInt(w, 10, 64); err == nil {
				return n
			}
		}
	}
	return 0
}

// countUserProcesses counts the sandbox's processes other than bwrap, its
// init and the agent.
func (m *machine) countUserProcesses() int {
	if m.r.cg == nil {
		return 0
	}
	agent, n := m.conn.PeerPID(), 0
	for _, pid := range m.r.cg.pids() {
		if pid != agent && nsPidOf(pid) > 1 {
			n++
		}
	}
	return n
}

// diskUsage is the session disk's use and size when it has its own disk
// (mounted in its stage), else what its files take, walked.
func (b *Backend) diskUsage(u *backends.Usage, dir, stage string, info backends.Session) {
	if b.diskQuota {
		u.DiskQuotaBytes = int64(quotaMB(info)) << 20
		mnt := filepath.Join(stage, fsDir)
		var st unix.Statfs_t
		if stage != "" && loopdisk.Mounted(mnt) && unix.Statfs(mnt, &st) == nil {
			u.DiskUsedBytes = int64(st.Blocks-st.Bfree) * st.Bsize
			u.DiskQuotaBytes = int64(st.Blocks) * st.Bsize
		}
		return
	}
	seen := 0
	_ = filepath.WalkDir(filepath.Join(dir, fsDir), func(p string, _ fs.DirEntry, err error) error {
		if seen++; err != nil || seen > maxUsageWalk {
			return fs.SkipAll
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			u.DiskUsedBytes += st.Blocks * 512
		}
		return nil
	})
}
