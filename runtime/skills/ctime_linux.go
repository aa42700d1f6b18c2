//go:build linux

package skills

import (
	"io/fs"
	"syscall"
	"time"
)

// changeTime is the inode change time, which the reference reports as
// created_at.
func changeTime(fi fs.FileInfo) time.Time {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	}
	return fi.ModTime()
}
