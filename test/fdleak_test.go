package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Where a careless host leaves descriptors open when it spawns boxrt.
const (
	leakedFileFD = 200
	leakedDirFD  = 201
)

// leakedFiles opens a host file and a host directory and places them at
// leakedFileFD and leakedDirFD of a child (exec.Cmd closes the nil slots),
// without close-on-exec, as a parent that forgot O_CLOEXEC would.
func leakedFiles(t *testing.T) (extra []*os.File, file, dir string) {
	t.Helper()
	dir = t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "host-secret"), []byte("host-only\n"), 0o644))
	file = filepath.Join(t.TempDir(), "host-log")
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	require.NoError(t, err)
	d, err := os.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close(); d.Close() })
	extra = make([]*os.File, leakedDirFD-2)
	extra[leakedFileFD-3], extra[leakedDirFD-3] = f, d
	return extra, file, dir
}

// fdProbe reports, from inside a session, each leaked descriptor it can
// see, whether it could write through the file one (by /proc: dash has no
// redirection above fd 9) and list the directory one (test is a shell
// builtin: /proc/self is the session's shell); probe=done proves it ran
// to the end.
var fdProbe = fmt.Sprintf(`ls -l /proc/self/fd/ 2>&1
for fd in %[1]d %[2]d; do [ -e /proc/self/fd/$fd ] && echo "fd$fd=open"; done
(echo escaped >>/proc/self/fd/%[1]d) 2>/dev/null && echo write=ok
ls /proc/self/fd/%[2]d/ 2>/dev/null
echo probe=done`, leakedFileFD, leakedDirFD)

// TestNoInheritedDescriptorInSandbox: boxrt spawned with a host file on
// fd 200 and a host directory on fd 201 (neither close-on-exec) runs a
// command in a session of each backend; the command sees neither, cannot
// write to the file nor list the directory.
func TestNoInheritedDescriptorInSandbox(t *testing.T) {
	configs := map[string]string{"host": `"backend":"host"`}
	for b, c := range backendConfigs {
		if b != "docker-runsc" {
			configs[b] = c
		}
	}
	for backend, cfg := range configs {
		t.Run(backend, func(t *testing.T) {
			extra, file, dir := leakedFiles(t)
			p := Start(t, Options{Stdio: true, Config: "{" + cfg + "}", ExtraFiles: extra})
			res := execIn(t, p, map[string]any{"session_id": "fdleak", "cmd": fdProbe})
			t.Logf("%s:\n%s%s", backend, res.Stdout, res.Stderr)
			require.Contains(t, res.Stdout, "probe=done", "the probe did not run to the end")
			for _, fd := range []int{leakedFileFD, leakedDirFD} {
				assert.NotContains(t, res.Stdout, fmt.Sprintf("fd%d=open", fd), "the host's descriptor %d reached the session", fd)
			}
			assert.NotContains(t, res.Stdout, "write=ok", "the session wrote through the host's descriptor")
			assert.NotContains(t, res.Stdout, "host-secret", "the session listed the host's directory")
			assert.NotContains(t, res.Stdout, filepath.Base(file), "a descriptor of the host's file is visible")
			assert.NotContains(t, res.Stdout, dir, "a descriptor of the host's directory is visible")
			b, err := os.ReadFile(file)
			require.NoError(t, err)
			assert.Empty(t, strings.TrimSpace(string(b)), "the host's file was written")
		})
	}
}
