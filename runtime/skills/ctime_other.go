//go:build !linux

package skills

import (
	"io/fs"
	"time"
)

// changeTime falls back to the modification time where ctime is not
// portable to reach.
func changeTime(fi fs.FileInfo) time.Time { return fi.ModTime() }
