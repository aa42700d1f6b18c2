package atomicfile

import (
	"os"
	"path/filepath"
)

// TempPrefix starts the name of every temporary file Write makes (after
// the target's own name), so a sweep can tell them from state files.
const TempPrefix = ".tmp-"

// Write replaces path with data, mode perm. The data is synced before the
// rename: after a crash (or a power loss) path holds either the previous
// content or data, never a prefix of it, and the sync is also where a
// full disk reports itself on filesystems that allocate late. On any
// failure the temporary file is removed and path is left as it was.
func Write(path string, data []byte, perm os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+TempPrefix+"*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
