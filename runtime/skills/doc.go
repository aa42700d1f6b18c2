// Package skills is boxrt's skill store: skill packages (a directory holding
// SKILL.md plus any other files) kept under one root on the host, with the
// operations behind the box_*_skill* JSON-RPC methods and the ZIP upload
// path (__file_chunk, box_preview_skill_zip, box_install_skill_zip).
//
// The on-disk format, name rule, discovery and limits follow the reference
// (langbot-box-runtime.md §8.4, §8.5, §9). Where boxrt does better:
//
//   - every caller-supplied path is checked after resolving symlinks, and
//     skill files are then opened through an os.Root, so a symlink swapped
//     in by a sandbox (skills are mounted into sessions) cannot redirect a
//     read or write outside the package between the check and the use;
//   - SKILL.md and skill files are written to a temporary file and renamed,
//     so a concurrent reader never sees a half-written file;
//   - operations lock per skill (name and package directory), not globally;
//   - ZIP sizes are enforced on the bytes actually decompressed, never on
//     the sizes the archive declares, and an install is all-or-nothing;
//   - list/get failures are BoxValidationError/BoxError values like the
//     rest, instead of raw exception classes;
//   - work directories (the private temp directory, install staging) are
//     flock-ed while in use, and opening the store removes those a killed
//     boxrt left behind.
//
// Every error returned by the Store is a *boxerr.Error.
package skills
