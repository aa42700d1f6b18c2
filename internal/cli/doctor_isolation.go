package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/docker/docker/client"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/backendfactory"
	"github.com/boxrt/boxrt/runtime"
)

// isolationEntry is the measured isolation of one backend and runtime.
type isolationEntry struct {
	Backend string `json:"backend"`
	// Runtime is the engine runtime (docker) or "" (bwrap).
	Runtime string `json:"runtime,omitempty"`
	backends.IsolationReport
}

// doctorIsolation measures every usable backend: bwrap once, docker once
// per OCI runtime the engine has registered (runc, runsc, …), each in a
// real probe sandbox that is removed afterwards.
func doctorIsolation(ctx context.Context, cfg runtime.Config, usable []string) []isolationEntry {
	var out []isolationEntry
	dir, err := os.MkdirTemp("", "boxrt-doctor-isolation-")
	if err != nil {
		return nil
	}
	defer os.RemoveAll(dir)
	measure := func(name, rt string, c runtime.Config) {
		b, err := backendfactory.New(name, c, "doctor-isolation", filepath.Join(dir, name+"-"+rt))
		if err != nil {
			out = append(out, isolationEntry{Backend: name, Runtime: rt, IsolationReport: backends.IsolationReport{Error: err.Error()}})
			return
		}
		defer runtime.CloseBackend(b)
		out = append(out, isolationEntry{Backend: name, Runtime: rt, IsolationReport: backends.ProbeIsolation(ctx, b, backends.DefaultSandboxSpec())})
	}
	for _, name := range usable {
		if name != "docker" {
			measure(name, "", cfg)
			continue
		}
		for _, rt := range dockerRuntimes(ctx) {
			c := cfg
			c.Docker.Runtime = rt
			c.Docker.GVisorRuntime = ""
			measure(name, rt, c)
		}
	}
	return out
}

// dockerRuntimes lists the OCI runtimes the engine has registered, the
// default first; containerd's shim names are left out (they are how the
// engine runs runc, not a choice an operator makes). Podman's Docker API
// lists runtimes it would not honour per container: only its default.
func dockerRuntimes(ctx context.Context) []string {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return []string{""}
	}
	defer cli.Close()
	if v, err := cli.ServerVersion(ctx); err == nil {
		for _, c := range v.Components {
			if strings.Contains(c.Name, "Podman") {
				return []string{""}
			}
		}
	}
	info, err := cli.Info(ctx)
	if err != nil || len(info.Runtimes) == 0 {
		return []string{""}
	}
	out := []string{info.DefaultRuntime}
	var rest []string
	for name := range info.Runtimes {
		if name != info.DefaultRuntime && !strings.HasPrefix(name, "io.containerd.") {
			rest = append(rest, name)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

func printIsolation(w io.Writer, entries []isolationEntry) {
	if len(entries) == 0 {
		return
	}
	fmt.Fprintf(w, "\nisolation, measured in a probe sandbox:\n")
	for _, e := range entries {
		name := e.Backend
		if e.Runtime != "" {
			name += "/" + e.Runtime
		}
		fmt.Fprintf(w, "  %-14s %s\n", name+":", e.Summary())
	}
}
