package skills

import (
	"slices"
	"sync"
)

// keyedLocks hands out one RWMutex per key and forgets it when nobody holds
// or waits for it, so the table stays as small as the set of busy skills.
type keyedLocks struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	rw   sync.RWMutex
	refs int
}

func (k *keyedLocks) get(key string) *keyedLock {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.refs++
	return l
}

func (k *keyedLocks) put(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.locks[key]
	l.refs--
	if l.refs == 0 {
		delete(k.locks, key)
	}
}

// lock takes the write locks of keys (de-duplicated, in sorted order, so two
// callers locking overlapping sets cannot deadlock) and returns the unlock.
// Callers lock name keys before package keys and never lock again while
// holding these, which keeps the global order total.
func (k *keyedLocks) lock(keys ...string) func() {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	held := make([]*keyedLock, len(keys))
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

// rlock takes one read lock.
func (k *keyedLocks) rlock(key string) func() {
	l := k.get(key)
	l.rw.RLock()
	return func() {
		l.rw.RUnlock()
		k.put(key)
	}
}

func nameKey(name string) string { return "name:" + name }

// pkgKey locks a package by its path relative to the store root.
func pkgKey(rel string) string { return "pkg:" + rel }
