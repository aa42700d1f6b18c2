package docker

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"

	"github.com/docker/docker/api/types/container"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/loopdisk"
)

// maxStatsBytes bounds the engine's one-shot stats answer.
const maxStatsBytes = 1 << 20

// SessionUsage measures the session from the engine's one-shot stats
// (CPU, memory, processes, network) and inspect (the writable layer's
// size), and from its quota disk when it has one on this host.
func (b *Backend) SessionUsage(ctx context.Context, info backends.Session) (backends.Usage, error) {
	if _, err := b.inspectOwned(ctx, info); err != nil {
		return backends.Usage{}, err
	}
	var u backends.Usage
	name := info.BackendSessionID
	resp, err := b.cli.ContainerStatsOneShot(ctx, name)
	if err != nil {
		return u, b.sessionError(info, "reading the stats of container "+name, err)
	}
	var st container.StatsResponse
	err = json.NewDecoder(io.LimitReader(resp.Body, maxStatsBytes)).Decode(&st)
	resp.Body.Close()
	if err != nil {
		return u, b.apiError("decoding the stats of container "+name, err)
	}
	u.CPUSeconds = float64(st.CPUStats.CPUUsage.TotalUsage) / 1e9
	u.MemoryBytes, u.MemoryPeakBytes = int64(st.MemoryStats.Usage), int64(st.MemoryStats.MaxUsage)
	if st.MemoryStats.Limit < 1<<60 {
		u.MemoryLimitBytes = int64(st.MemoryStats.Limit)
	}
	u.Processes = int(st.PidsStats.Current)
	for _, n := range st.Networks {
		u.NetRxBytes += int64(n.RxBytes)
		u.NetTxBytes += int64(n.TxBytes)
	}
	b.diskUsage(ctx, &u, info)
	return u, nil
}

// diskUsage is the quota disk's use and size when the workspace has one,
// else the container's writable layer (what its workspace volume holds is
// not counted).
func (b *Backend) diskUsage(ctx context.Context, u *backends.Usage, info backends.Session) {
	name := info.BackendSessionID
	if b.stateDir != "" && b.localEngine() {
		mnt := filepath.Join(b.quotaDir(name), quotaMount)
		var fs unix.Statfs_t
		if loopdisk.Mounted(mnt) && unix.Statfs(mnt, &fs) == nil {
			u.DiskUsedBytes = int64(fs.Blocks-fs.Bfree) * fs.Bsize
			u.DiskQuotaBytes = int64(fs.Blocks) * fs.Bsize
		}
	}
	c, _, err := b.cli.ContainerInspectWithRaw(ctx, name, true)
	if err == nil && c.SizeRw != nil {
		u.DiskUsedBytes += *c.SizeRw
	}
	if c.State != nil {
		u.OOMKills = max(b.oomKills(c.State.Pid), 0)
	}
}
