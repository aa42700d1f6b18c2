package skills

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// discoveryEntryLimit is MaxDiscoveryEntries; a variable only so tests can
// reach it without creating ten thousand directories.
var discoveryEntryLimit = MaxDiscoveryEntries

// discover walks base breadth-first and returns the directories that hold
// an entry file (a skill is not descended into). Directory symlinks are
// never followed — os.ReadDir reports them as symlinks, not directories —
// so discovery cannot leave base. Unreadable directories are skipped. At
// most MaxDiscoveryEntries directory entries are read in total and at most
// MaxDiscoveredSkills skills returned; beyond either the walk fails rather
// than silently returning a partial store. A directory named skip ("" for
// none) is not entered.
func discover(ctx context.Context, base string, maxDepth int, skip string) ([]string, error) {
	type item struct {
		dir   string
		depth int
	}
	queue := []item{{base, 0}}
	budget := discoveryEntryLimit
	var found []string
	for len(queue) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		it := queue[0]
		queue = queue[1:]
		if hasEntry(it.dir) {
			found = append(found, it.dir)
			if len(found) > MaxDiscoveredSkills {
				return nil, boxerr.Failure("Skill discovery exceeded the configured package limit (%d)", MaxDiscoveredSkills)
			}
			continue
		}
		if it.depth >= maxDepth {
			continue
		}
		names, err := readDirNames(it.dir, &budget)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if dir := filepath.Join(it.dir, n); dir != skip {
				queue = append(queue, item{dir, it.depth + 1})
			}
		}
	}
	return found, nil
}

// readDirNames returns the sorted names of dir's real subdirectories,
// reading in batches so an enormous directory costs at most the remaining
// budget, not its full size.
func readDirNames(dir string, budget *int) ([]string, error) {
	// O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK: if a sandbox swapped this
	// directory for a symlink or a FIFO after it was listed, the open
	// fails instead of following it or blocking.
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil // unreadable: skipped
	}
	defer f.Close()
	var names []string
	for {
		batch, err := f.ReadDir(256)
		*budget -= len(batch)
		if *budget < 0 {
			return nil, boxerr.Failure("Skill discovery exceeded the configured entry limit (%d entries)", discoveryEntryLimit)
		}
		for _, de := range batch {
			if de.IsDir() && !strings.HasPrefix(de.Name(), internalPrefix) {
				names = append(names, de.Name())
			}
		}
		if err == io.EOF || len(batch) == 0 {
			break
		}
		if err != nil {
			break // partially unreadable: keep what we have
		}
	}
	sort.Strings(names)
	return names, nil
}
