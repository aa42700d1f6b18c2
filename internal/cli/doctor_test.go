package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxrt/boxrt/runtime"
)

func TestDockerIsolationChecks(t *testing.T) {
	tests := []struct {
		name              string
		opts              []string
		userns, seccompOK string
	}{
		{"default engine", []string{"name=seccomp,profile=default"}, "warn", "ok"},
		{"userns-remap", []string{"name=seccomp,profile=default", "name=userns"}, "ok", "ok"},
		{"unconfined", []string{"name=seccomp,profile=unconfined", "name=userns"}, "ok", "warn"},
		{"no seccomp", []string{"name=apparmor"}, "warn", "warn"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := dockerIsolationChecks(tc.opts)
			if len(got) != 2 || got[0].Status != tc.userns || got[1].Status != tc.seccompOK {
				t.Errorf("checks %+v, want userns %s seccomp %s", got, tc.userns, tc.seccompOK)
			}
		})
	}
}

// TestDoctorKubeBadKubeconfig: a kubeconfig that cannot be loaded is a
// failed check that says so, and the Role is still printed.
func TestDoctorKubeBadKubeconfig(t *testing.T) {
	cfg := runtime.DefaultConfig()
	cfg.Backend = "kube"
	cfg.Kube.Kubeconfig = filepath.Join(t.TempDir(), "missing")
	cfg.Kube.Namespace = "sandboxes"
	checks, role := doctorKube(context.Background(), cfg)
	if len(checks) != 1 || checks[0].Status != "fail" || !strings.Contains(checks[0].What, "cannot load the cluster configuration") {
		t.Errorf("checks = %+v", checks)
	}
	for _, want := range []string{"kind: Role", "namespace: sandboxes", `resources: ["pods/exec"]`, `apiGroups: ["networking.k8s.io"]`} {
		if !strings.Contains(role, want) {
			t.Errorf("Role lacks %q:\n%s", want, role)
		}
	}
}
