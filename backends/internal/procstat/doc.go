// Package procstat reads what the kernel counts for a sandbox, seen from
// one of its processes: its memory cgroup's OOM kills, for the backends'
// usage measurements and OOM reports.
package procstat
