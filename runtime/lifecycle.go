package runtime

import "sync"

// lifecycle is the runtime's shutdown gate. Work that Close waits for
// (creations, resumes, process starts, box_execs, background goroutines)
// is counted in its WaitGroup only through enter, which refuses once
// shutdown began: no Add ever races Close's Wait.
type lifecycle struct {
	mu   sync.Mutex
	down bool
}

// enter counts one more piece of work in wg, unless the runtime is
// shutting down.
func (l *lifecycle) enter(wg *sync.WaitGroup) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return false
	}
	wg.Add(1)
	return true
}

// shutDown closes the gate for good.
func (l *lifecycle) shutDown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = true
}

func (l *lifecycle) shuttingDown() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.down
}
