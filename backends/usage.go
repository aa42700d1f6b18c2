package backends

// Usage is what a session's sandbox uses right now, as its backend
// measures it (box_get_session_metrics). A value the backend cannot
// measure stays 0; Measured lists the ones it did.
type Usage struct {
	CPUSeconds       float64 `json:"cpu_seconds"`
	MemoryBytes      int64   `json:"memory_bytes"`
	MemoryPeakBytes  int64   `json:"memory_peak_bytes"`
	MemoryLimitBytes int64   `json:"memory_limit_bytes"`
	DiskUsedBytes    int64   `json:"disk_used_bytes"`
	DiskQuotaBytes   int64   `json:"disk_quota_bytes"`
	NetRxBytes       int64   `json:"net_rx_bytes"`
	NetTxBytes       int64   `json:"net_tx_bytes"`
	Processes        int     `json:"processes"`
	// OOMKills is how many processes the memory limit killed so far.
	OOMKills int64 `json:"oom_kills"`
}
