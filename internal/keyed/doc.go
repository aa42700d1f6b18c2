// Package keyed provides per-key locks that hold no memory for idle keys:
// the runtime serialises work per session id with them, the skill store
// per skill name and package. It is a leaf: it imports nothing of boxrt.
package keyed
