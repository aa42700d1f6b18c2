package keyed

import (
	"slices"
	"sync"
)

// Locks hands out one RWMutex per key and forgets it when nobody holds or
// waits for it, so the table stays as small as the set of busy keys. The
// zero value is ready to use.
type Locks struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	rw   sync.RWMutex
	refs int
}

func (k *Locks) get(key string) *entry {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.locks == nil {
		k.locks = map[string]*entry{}
	}
	l := k.locks[key]
	if l == nil {
		l = &entry{}
		k.locks[key] = l
	}
	l.refs++
	return l
}

func (k *Locks) put(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.locks[key]
	l.refs--
	if l.refs == 0 {
		delete(k.locks, key)
	}
}

// Lock takes the write locks of keys (de-duplicated, in sorted order, so two
// callers locking overlapping sets cannot deadlock) and returns the unlock.
// A caller that locks again while holding keys must keep a global order of
// its own.
func (k *Locks) Lock(keys ...string) func() {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	held := make([]*entry, len(keys))
	for i, key := range keys {
		held[i] = k.get(key)
		held[i].rw.Lock()
	}
	return func() {
		for i := len(keys) - 1; i >= 0; i-- {
			held[i].rw.Unlock()
			k.put(keys[i])
		}
	}
}

// RLock takes the read lock of key and returns the unlock.
func (k *Locks) RLock(key string) func() {
	l := k.get(key)
	l.rw.RLock()
	return func() {
		l.rw.RUnlock()
		k.put(key)
	}
}
