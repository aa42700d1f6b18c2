package skills

// The store's lock keys (keyed.Locks): callers lock name keys before
// package keys and never lock again while holding these, which keeps the
// global lock order total.

// nameKey locks a skill by name.
func nameKey(name string) string { return "name:" + name }

// pkgKey locks a package by its path relative to the store root.
func pkgKey(rel string) string { return "pkg:" + rel }
