package main

import (
	"fmt"
	"path/filepath"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/bwrap"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/runtime"
)

// newBackend is the runtime's backend factory: the only place that knows
// the concrete backends.
func newBackend(name string, cfg runtime.Config, instanceID, stateDir string) (backends.Backend, error) {
	switch name {
	case "docker":
		return docker.New(docker.Config{
			InstanceID:              instanceID,
			DefaultImage:            cfg.Docker.Image,
			User:                    cfg.Docker.User,
			CPULimitEnabled:         bool(cfg.Docker.CPULimitEnabled),
			TmpSizeMB:               cfg.Docker.TmpSizeMB,
			ProcessUser:             cfg.Docker.ProcessUser,
			StateDir:                filepath.Clean(stateDir),
			DefaultWorkspaceQuotaMB: cfg.Docker.WorkspaceQuotaMB,
			Runtime:                 cfg.Docker.Runtime,
			GVisorRuntime:           cfg.Docker.GVisorRuntime,
		})
	case "bwrap":
		return bwrap.New(bwrap.Config{InstanceID: instanceID, StateDir: filepath.Clean(stateDir)})
	}
	return nil, fmt.Errorf("unknown backend %q", name)
}

// The real backends report measured isolation (box_get_backend_info).
var (
	_ runtime.IsolationProber = (*docker.Backend)(nil)
	_ runtime.IsolationProber = (*bwrap.Backend)(nil)
)
