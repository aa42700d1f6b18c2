package docker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

// TestExecOnStoppedContainer: an exec whose container is stopped, or stops
// under it, is a typed "session gone" error (which the runtime answers by
// recreating the session), never a completed result carrying the engine's
// error text or the kill signal of the container's end.
func TestExecOnStoppedContainer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		before func(t *testing.T, name string)
		cmd    string
	}{
		{
			name: "stopped before the exec",
			before: func(t *testing.T, name string) {
				timeout := 1
				if err := rawClient(t).ContainerStop(context.Background(), name, container.StopOptions{Timeout: &timeout}); err != nil {
					t.Fatal(err)
				}
			},
			cmd: "echo hi",
		},
		{
			name: "stops during the exec",
			cmd:  "kill 1; sleep 10; echo survived",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t)
			info := startSession(t, b)
			if tc.before != nil {
				tc.before(t, info.BackendSessionID)
			}
			r := run(t, b, info, tc.cmd, 30*time.Second)
			if !isKind(r.err, boxerr.ErrSessionNotFound) {
				t.Fatalf("exec: status %+v err %v stdout %q stderr %q; want BoxSessionNotFoundError", r.status, r.err, r.stdout, r.stderr)
			}
		})
	}
}

// TestHostPathSwappedForSymlink: a host path checked when the session was
// made, then replaced by a symlink out of the allowed roots (what another
// session with a rw mount of the parent can do), is refused when the engine
// would bind it again: at a restart of a re-adopted persistent session, and
// between the check and the start of a new one. Nothing is mounted.
func TestHostPathSwappedForSymlink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := rawClient(t)
	// outside plays /etc: a directory outside every allowed root.
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	swap := func(t *testing.T, path string) {
		t.Helper()
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, path); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		field string
		set   func(s *backends.Spec, path string)
	}{
		{"host_path", "host_path", func(s *backends.Spec, p string) { s.HostPath = p }},
		{"extra mount", "extra_mounts[0].host_path", func(s *backends.Spec, p string) {
			s.ExtraMounts = []backends.MountSpec{{HostPath: p, MountPath: "/data", Mode: backends.MountRO}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name+" re-adopted", func(t *testing.T) {
			t.Parallel()
			sub := filepath.Join(t.TempDir(), "sub")
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			b := newBackend(t)
			info := startSession(t, b, func(s *backends.Spec) { s.Persistent = true; tc.set(s, sub) })
			if err := cli.ContainerKill(ctx, info.BackendSessionID, "KILL"); err != nil {
				t.Fatal(err)
			}
			waitState(t, info.BackendSessionID, "exited")
			swap(t, sub)

			restarted, err := docker.New(docker.Config{InstanceID: instanceOf(t, info), DefaultImage: testImage})
			if err != nil {
				t.Fatal(err)
			}
			defer restarted.Close()
			adopted, err := restarted.Adopt(ctx)
			if !isKind(err, boxerr.ErrValidation) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Adopt err = %v, want a BoxValidationError naming %s", err, tc.field)
			}
			if len(adopted) != 0 {
				t.Errorf("adopted %+v", adopted)
			}
			c, err := cli.ContainerInspect(ctx, info.BackendSessionID)
			if err != nil {
				t.Fatal(err)
			}
			if c.State.Running {
				t.Error("the container was restarted with a swapped host path")
			}
		})
		t.Run(tc.name+" new session", func(t *testing.T) {
			t.Parallel()
			sub := filepath.Join(t.TempDir(), "sub")
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			swap(t, sub) // checked by the runtime as a directory, swapped since
			id := instanceID()
			b := newBackend(t, func(c *docker.Config) { c.InstanceID = id })
			spec := testSpec(t)
			tc.set(&spec, sub)
			if err := spec.Normalize(); err != nil {
				t.Fatal(err)
			}
			_, err := b.StartSession(ctx, spec)
			if !isKind(err, boxerr.ErrValidation) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("StartSession err = %v, want a BoxValidationError naming %s", err, tc.field)
			}
			list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
				filters.Arg("label", docker.LabelInstance+"="+id))})
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 0 {
				t.Errorf("containers left behind: %d", len(list))
			}
		})
	}
}
