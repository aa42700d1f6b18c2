package backends

import "sync"

// Creating is the set of sandboxes (by backend session id) a Backend is
// creating right now. Adopt removes what an earlier, killed boxrt process
// of the installation half-made (a sandbox without its record, a container
// never started) and must tell that from one this process is still making;
// the state directory's lock keeps any other process from making them. The
// zero value is ready to use.
type Creating struct {
	mu    sync.Mutex
	names map[string]int
}

// Begin records name as being created until done is called.
func (c *Creating) Begin(name string) (done func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names == nil {
		c.names = map[string]int{}
	}
	c.names[name]++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.names[name]--; c.names[name] <= 0 {
			delete(c.names, name)
		}
	}
}

// Has reports whether name is being created.
func (c *Creating) Has(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.names[name] > 0
}
