package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDockerDaemonConfig: scripts/docker-daemon-config merges boxrt's keys
// into daemon.json without losing the operator's, rewrites nothing when
// nothing changes, and says what dockerd must do: reload (SIGHUP) for
// runtimes, restart for experimental. runsc always gets --oci-seccomp and
// --host-uds=open (another --host-uds is replaced). A broken file is
// refused, untouched.
func TestDockerDaemonConfig(t *testing.T) {
	// gVisor applies a container's seccomp profile only with the first
	// flag; the second lets the session agent dial its host socket.
	seccomp := []any{"--oci-seccomp", "--host-uds=open"}
	tests := []struct {
		name, before string
		args         []string
		action       string
		runtimeArgs  []any
	}{
		{"no file", "", nil, "restart", seccomp},
		{"experimental already on", `{"experimental":true}`, nil, "reload", seccomp},
		{"up to date", `{"experimental":true,"runtimes":{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--oci-seccomp","--host-uds=open"]}}}`, nil, "none", seccomp},
		{"host-uds flag added", `{"experimental":true,"runtimes":{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--oci-seccomp"]}}}`, nil, "reload", seccomp},
		{"wider host-uds narrowed", `{"experimental":true,"runtimes":{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--host-uds=all","--oci-seccomp"]}}}`, nil, "reload", seccomp},
		{"seccomp flag added", `{"experimental":true,"runtimes":{"runsc":{"path":"/usr/bin/runsc"}}}`, nil, "reload", seccomp},
		{"keeps other keys and args", `{"log-level":"warn","experimental":true,"runtimes":{"x":{"path":"/x"},"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--debug"]}}}`,
			[]string{"--runsc-network-host"}, "reload", []any{"--debug", "--oci-seccomp", "--host-uds=open", "--network=host"}},
		{"network arg dropped again", `{"experimental":true,"runtimes":{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--oci-seccomp","--host-uds=open","--network=host"]}}}`,
			nil, "reload", seccomp},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "daemon.json")
			if tc.before != "" {
				require.NoError(t, os.WriteFile(file, []byte(tc.before), 0o644))
			}
			out, err := exec.Command("../scripts/docker-daemon-config", append([]string{"--file", file}, tc.args...)...).CombinedOutput()
			require.NoError(t, err, "%s", out)
			assert.Equal(t, tc.action, strings.TrimSpace(string(out)))
			var got map[string]any
			raw, err := os.ReadFile(file)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(raw, &got))
			assert.Equal(t, true, got["experimental"])
			runsc := got["runtimes"].(map[string]any)["runsc"].(map[string]any)
			assert.Equal(t, "/usr/bin/runsc", runsc["path"])
			assert.Equal(t, tc.runtimeArgs, runsc["runtimeArgs"], "%s", raw)
			if strings.Contains(tc.before, "log-level") {
				assert.Equal(t, "warn", got["log-level"])
				assert.Contains(t, got["runtimes"], "x")
			}
			again, err := exec.Command("../scripts/docker-daemon-config", append([]string{"--file", file}, tc.args...)...).Output()
			require.NoError(t, err)
			assert.Equal(t, "none", strings.TrimSpace(string(again)), "a second run changes nothing")
			left, _ := filepath.Glob(filepath.Join(filepath.Dir(file), ".daemon.json.*"))
			assert.Empty(t, left, "no temp file left")
		})
	}
	t.Run("broken file is refused", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "daemon.json")
		require.NoError(t, os.WriteFile(file, []byte("{not json"), 0o644))
		out, err := exec.Command("../scripts/docker-daemon-config", "--file", file).CombinedOutput()
		require.Error(t, err)
		assert.Contains(t, string(out), "not valid JSON")
		raw, _ := os.ReadFile(file)
		assert.Equal(t, "{not json", string(raw))
	})
}

// TestPodmanSeccomp: the profile scripts/podman-seccomp derives from
// Podman's default allows clone only without namespace flags and denies
// clone3, unshare, setns and mount, with nothing else left naming them.
func TestPodmanSeccomp(t *testing.T) {
	src := "/usr/share/containers/seccomp.json"
	_, err := os.Stat(src)
	require.NoError(t, err, "Podman's default profile (scripts/setup installs podman)")
	out := filepath.Join(t.TempDir(), "seccomp.json")
	b, err := exec.Command("../scripts/podman-seccomp", "--from", src, out).CombinedOutput()
	require.NoError(t, err, "%s", b)
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var prof struct {
		Syscalls []struct {
			Names  []string         `json:"names"`
			Action string           `json:"action"`
			Args   []map[string]any `json:"args"`
		} `json:"syscalls"`
	}
	require.NoError(t, json.Unmarshal(raw, &prof))
	rules := map[string][]string{}
	for _, r := range prof.Syscalls {
		for _, n := range r.Names {
			switch n {
			case "clone", "clone3", "unshare", "setns", "mount":
				what := r.Action
				if len(r.Args) > 0 {
					what += " if masked"
				}
				rules[n] = append(rules[n], what)
			}
		}
	}
	assert.Equal(t, map[string][]string{
		"clone":   {"SCMP_ACT_ALLOW if masked"},
		"clone3":  {"SCMP_ACT_ERRNO"},
		"unshare": {"SCMP_ACT_ERRNO"},
		"setns":   {"SCMP_ACT_ERRNO"},
		"mount":   {"SCMP_ACT_ERRNO"},
	}, rules)
}
