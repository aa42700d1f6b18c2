package actions

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

func TestDecodeSpec(t *testing.T) {
	t.Run("reference defaults", func(t *testing.T) {
		s, err := DecodeSpec([]byte(`{"session_id":" s1 ","cmd":"  echo hi  ","skill_name":null,"host_path":null,"extra_mounts":[]}`))
		require.NoError(t, err)
		assert.Equal(t, "s1", s.SessionID)
		assert.Equal(t, "echo hi", s.Cmd)
		assert.Equal(t, "/workspace", s.Workdir)
		assert.Equal(t, 30, s.TimeoutSec)
		assert.Equal(t, backends.NetworkOff, s.Network)
		assert.Equal(t, backends.MountRW, s.HostPathMode)
		assert.Equal(t, 1.0, s.CPUs)
		assert.Equal(t, 512, s.MemoryMB)
		assert.Equal(t, 128, s.PidsLimit)
		assert.True(t, s.ReadOnlyRootfs)
	})
	t.Run("upper bounds accepted", func(t *testing.T) {
		s, err := DecodeSpec([]byte(`{"session_id":"s","memory_mb":1048576,"cpus":0.01,"pids_limit":4194304,"workspace_quota_mb":1048576,"timeout_sec":86400}`))
		require.NoError(t, err)
		assert.Equal(t, backends.MaxMemoryMB, s.MemoryMB)
	})
	t.Run("mount path cleaned", func(t *testing.T) {
		s, err := DecodeSpec([]byte(`{"session_id":"s","mount_path":"/data//w/","extra_mounts":[{"host_path":"/srv","mount_path":"/x/./y/"}]}`))
		require.NoError(t, err)
		assert.Equal(t, "/data/w", s.MountPath)
		assert.Equal(t, "/x/y", s.ExtraMounts[0].MountPath)
	})
	t.Run("workdir defaults to mount_path", func(t *testing.T) {
		s, err := DecodeSpec([]byte(`{"session_id":"s","mount_path":"/data","workdir":""}`))
		require.NoError(t, err)
		assert.Equal(t, "/data", s.Workdir)
	})
	tests := []struct{ name, params, field string }{
		{"missing session", `{}`, "session_id"},
		{"array params", `[1]`, "params"},
		{"unknown field", `{"session_id":"s","nope":1}`, "nope"},
		{"wrong type", `{"session_id":"s","timeout_sec":"5"}`, "timeout_sec"},
		{"float for int", `{"session_id":"s","memory_mb":5.5}`, "memory_mb"},
		// session_id and memory_mb sit in structs runtime.Spec embeds: the
		// field is named as on the wire, without the Go struct names.
		{"session id type", `{"session_id":1}`, "session_id"},
		{"zero timeout", `{"session_id":"s","timeout_sec":0}`, "timeout_sec"},
		{"network case", `{"session_id":"s","network":"ON"}`, "network"},
		{"mode", `{"session_id":"s","host_path_mode":"x"}`, "host_path_mode"},
		{"relative mount", `{"session_id":"s","mount_path":"w"}`, "mount_path"},
		{"relative host path", `{"session_id":"s","host_path":"w"}`, "host_path"},
		{"cpus", `{"session_id":"s","cpus":0}`, "cpus"},
		{"memory", `{"session_id":"s","memory_mb":31}`, "memory_mb"},
		{"pids", `{"session_id":"s","pids_limit":0}`, "pids_limit"},
		{"quota", `{"session_id":"s","workspace_quota_mb":-1}`, "workspace_quota_mb"},
		{"env value type", `{"session_id":"s","env":{"A":1}}`, "env"},
		{"env name", `{"session_id":"s","env":{"A=B":"x"}}`, "env"},
		{"workdir outside mount", `{"session_id":"s","host_path":"/srv/x","workdir":"/etc"}`, "workdir"},
		{"extra mount path", `{"session_id":"s","extra_mounts":[{"host_path":"/srv","mount_path":"d"}]}`, "extra_mounts[0].mount_path"},
		{"skill mode", `{"session_id":"s","skills":[{"name":"a","mode":"none"}]}`, "skills[0].mode"},
		{"output cap", `{"session_id":"s","max_output_bytes":10}`, "max_output_bytes"},
		{"nul in id", `{"session_id":"a\u0000b"}`, "session_id"},
		// Numeric bounds: values that overflowed into "no limit" or reached
		// the engine as BoxError.
		{"memory 2^44", `{"session_id":"s","memory_mb":17592186044416}`, "memory_mb"},
		{"memory above 1 TiB", `{"session_id":"s","memory_mb":1048577}`, "memory_mb"},
		{"memory beyond int64", `{"session_id":"s","memory_mb":1e30}`, "memory_mb"},
		{"cpus tiny", `{"session_id":"s","cpus":1e-12}`, "cpus"},
		{"cpus below docker minimum", `{"session_id":"s","cpus":0.009}`, "cpus"},
		{"cpus huge", `{"session_id":"s","cpus":1e300}`, "cpus"},
		{"cpus negative", `{"session_id":"s","cpus":-1}`, "cpus"},
		{"pids huge", `{"session_id":"s","pids_limit":4194305}`, "pids_limit"},
		{"pids 2^62", `{"session_id":"s","pids_limit":4611686018427387904}`, "pids_limit"},
		{"quota huge", `{"session_id":"s","workspace_quota_mb":1048577}`, "workspace_quota_mb"},
		{"timeout huge", `{"session_id":"s","timeout_sec":86401}`, "timeout_sec"},
		{"timeout 2^62", `{"session_id":"s","timeout_sec":4611686018427387904}`, "timeout_sec"},
		{"output cap huge", `{"session_id":"s","max_output_bytes":4194305}`, "max_output_bytes"},
		// Sandbox-side mount points, the same rule for every backend.
		{"mount root", `{"session_id":"s","mount_path":"/"}`, "mount_path"},
		{"mount root dotted", `{"session_id":"s","mount_path":"/x/.."}`, "mount_path"},
		{"mount proc", `{"session_id":"s","mount_path":"/proc"}`, "mount_path"},
		{"mount under proc", `{"session_id":"s","mount_path":"/proc/x"}`, "mount_path"},
		{"mount under dev", `{"session_id":"s","mount_path":"/dev/shm"}`, "mount_path"},
		{"mount under sys", `{"session_id":"s","mount_path":"/sys/fs/cgroup"}`, "mount_path"},
		{"extra mount root", `{"session_id":"s","extra_mounts":[{"host_path":"/srv","mount_path":"//"}]}`, "extra_mounts[0].mount_path"},
		{"extra mount proc", `{"session_id":"s","extra_mounts":[{"host_path":"/srv","mount_path":"/proc/x"}]}`, "extra_mounts[0].mount_path"},
		{"extra mount on workspace", `{"session_id":"s","extra_mounts":[{"host_path":"/srv","mount_path":"/workspace/"}]}`, "extra_mounts[0].mount_path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSpec([]byte(tc.params))
			require.ErrorIs(t, err, boxerr.ErrValidation)
			var be *boxerr.Error
			require.True(t, errors.As(err, &be))
			assert.Equal(t, tc.field, be.Details["field"], be.Msg)
		})
	}
}

// TestConfigDecoding: box_init and config files decode the merged
// configuration with DecodeParams, so a wrong type names its dotted key.
func TestConfigDecoding(t *testing.T) {
	tests := []struct{ name, patch, field string }{
		{"wrong type", `{"limits":{"max_sessions":"x"}}`, "limits.max_sessions"},
		{"wrong nested type", `{"docker":{"user":5}}`, "docker.user"},
		{"section not an object", `{"limits":[1]}`, "limits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := runtime.DefaultConfig()
			got, _, err := cfg.Merge([]byte(tc.patch), DecodeParams)
			require.ErrorIs(t, err, boxerr.ErrValidation)
			var be *boxerr.Error
			require.True(t, errors.As(err, &be))
			assert.Equal(t, tc.field, be.Details["field"], be.Msg)
			assert.Equal(t, cfg, got, "an invalid patch changes nothing")
		})
	}
}

// FuzzDecodeSpec: any params either decode into a spec that passes its own
// validation again, or fail with a BoxValidationError naming a field.
func FuzzDecodeSpec(f *testing.F) {
	for _, seed := range []string{
		`{"session_id":"s","cmd":"echo"}`, `{}`, `[]`, `null`, `{"session_id":1}`,
		`{"session_id":"s","extra_mounts":[{"host_path":"/a","mount_path":"/b","mode":"ro"}]}`,
		`{"session_id":"s","env":{"A":"B"},"cpus":0.5,"network":"on"}`,
		`{"session_id":"s","skills":[{"name":"x"}],"skill_name":"y"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, params []byte) {
		s, err := DecodeSpec(params)
		if err != nil {
			var be *boxerr.Error
			if !errors.As(err, &be) || be.Kind != boxerr.ErrValidation {
				t.Fatalf("not a validation error: %v", err)
			}
			if be.Details["field"] == nil || be.Details["field"] == "" {
				t.Fatalf("validation error without a field: %v", err)
			}
			return
		}
		again := s
		if err := again.Normalize(); err != nil {
			t.Fatalf("a decoded spec fails its own validation: %v", err)
		}
	})
}

// TestLiveParamsFieldPaths: errors in the live members of box_exec and
// box_exec_start name the wire field.
func TestLiveParamsFieldPaths(t *testing.T) {
	cases := []struct {
		name, raw, field string
		start            bool
	}{
		{name: "stream type", raw: `{"session_id":"s","cmd":"x","stream":"yes"}`, field: "stream"},
		{name: "pty rows type", raw: `{"session_id":"s","cmd":"x","pty":{"rows":"a","cols":1}}`, field: "pty.rows"},
		{name: "pty rows range", raw: `{"session_id":"s","cmd":"x","pty":{"rows":0,"cols":1}}`, field: "pty.rows"},
		{name: "stdin only on start", raw: `{"session_id":"s","cmd":"x","stdin":true}`, field: "stdin"},
		{name: "stdin type on start", raw: `{"session_id":"s","cmd":"x","stdin":1}`, field: "stdin", start: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.start {
				var p startParams
				err = p.decodeParams(json.RawMessage(tc.raw))
			} else {
				var p execParams
				err = p.decodeParams(json.RawMessage(tc.raw))
			}
			var be *boxerr.Error
			require.True(t, errors.As(err, &be), "%v", err)
			assert.Equal(t, tc.field, be.Details["field"])
		})
	}
}
