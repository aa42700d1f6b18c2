package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/boxrt/boxrt/backends"
)

// strictFake is a fake backend with the strict readiness probe, measured by
// backends.ProbeStrictIsolation against what its execs do.
type strictFake struct {
	*fakeBackend
	storage bool
}

func (s strictFake) StrictReadiness(ctx context.Context, workspace string) backends.StrictReadiness {
	iso, err := backends.ProbeStrictIsolation(ctx, s, workspace)
	r := backends.StrictReadiness{NamespaceIsolation: iso.Namespace, MountIsolation: iso.Mount,
		NetworkIsolation: iso.Network, BoundedEphemeralStorage: s.storage}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

func TestStrictReadiness(t *testing.T) {
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("reading the test's network namespace: %v", err)
	}
	// exec is what a probe sandbox does: write the marker into the bound
	// host directory (or not) and print a network namespace.
	exec := func(writeMarker bool, netns string) func(context.Context, backends.Session, backends.ExecRequest) (backends.ExitStatus, error) {
		return func(_ context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
			if writeMarker {
				if err := os.WriteFile(filepath.Join(info.HostPath, ".mounted"), []byte("readiness"), 0o644); err != nil {
					return backends.ExitStatus{}, err
				}
			}
			fmt.Fprintln(req.Stdout, netns)
			return backends.ExitStatus{}, nil
		}
	}
	cases := []struct {
		name    string
		backend func() backends.Backend
		want    backends.StrictReadiness
		errText string
	}{
		{name: "no probe", backend: func() backends.Backend { return newFake() },
			want: backends.StrictReadiness{Available: true}, errText: "backend fake has no strict readiness probe"},
		{name: "isolated", backend: func() backends.Backend {
			f := newFake()
			f.execFn = exec(true, "net:[4026532999]")
			return strictFake{fakeBackend: f, storage: true}
		}, want: backends.StrictReadiness{Available: true, NamespaceIsolation: true, MountIsolation: true, NetworkIsolation: true, BoundedEphemeralStorage: true}},
		{name: "host network", backend: func() backends.Backend {
			f := newFake()
			f.execFn = exec(true, own)
			return strictFake{fakeBackend: f}
		}, want: backends.StrictReadiness{Available: true, NamespaceIsolation: true, MountIsolation: true}},
		{name: "mount not shared", backend: func() backends.Backend {
			f := newFake()
			f.execFn = exec(false, "net:[4026532999]")
			return strictFake{fakeBackend: f}
		}, want: backends.StrictReadiness{Available: true, NamespaceIsolation: true, NetworkIsolation: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rt, _ := newTestRuntime(t, c.backend(), "")
			ws := t.TempDir()
			name, got := rt.StrictReadiness(context.Background(), ws)
			assert.Equal(t, "fake", name)
			assert.Equal(t, c.errText, got.Error)
			got.Error, got.CgroupLimits = "", nil
			assert.Equal(t, c.want, got)
			entries, _ := os.ReadDir(ws)
			assert.Empty(t, entries, "the probe directory is removed")
		})
	}
}
