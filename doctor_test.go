package main

import "testing"

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
