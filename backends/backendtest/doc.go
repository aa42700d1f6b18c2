// Package backendtest holds the conformance tests every backend runs, so
// each is written once: the escape tests (RunEscapeTests: one table, run
// against each backend and runtime of the test matrix, with a static probe
// program, test/fixtures/escape, inside a sandbox), the file API tests
// (Files) and the live exec tests (LiveExec). Only tests import it.
//
// A backend's test package builds one Env: its Backend, a Spec factory
// for sessions (the functions start and stop the sessions themselves, after
// adding their mounts and limits), and the few facts where backends
// legitimately differ (FileUID, FileDirs, KernelShared, NoProcesses). Its
// own cases stay in its package: LiveExec takes extra LiveCases (how a
// signal ends a tree differs per backend), and tests that need the
// backend's insides (bwrap's host-side symlink race) are its own tests.
//
// A new backend (kube, once it serves the file API and live exec) runs
// the same tests with, in its test package:
//
//	func TestFiles(t *testing.T)    { backendtest.Files(t, env(t)) }
//	func TestExecLive(t *testing.T) { backendtest.LiveExec(t, env(t), ownCases...) }
//
// where env's Backend implements runtime.FileSystem (the contract the
// runtime serves the file API through; this package imports runtime for
// it, and only for it) and NoProcesses looks for leftovers where that backend can see them (in
// the Pod, with ps). Files mounts host directories (ReachableDir) as an rw
// extra mount and as a read-only workspace and extra mount; kube refuses
// host paths, so it needs an Env hook that mounts a prepared volume of its
// own in their place before it can call Files.
package backendtest
