package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"

	"github.com/boxrt/boxrt/backends"
)

// engineNew times the Docker engine alone doing what a new docker session
// costs it: a container with a session's hardening and limits (no
// capabilities, no-new-privileges, read-only root, init, no network, the
// tmpfs for pid files, the default memory, CPU and pids limits) and two
// anonymous volumes for its workspace and /tmp, created, attached and
// started until its `echo hi` is read. The engine's default seccomp
// profile stands in for boxrt's (both are one filter load). Each container
// is removed afterwards, untimed.
type engineNew struct {
	cli   *client.Client
	image string
	label string // benchLabel's value: the final cleanup finds strays
	// samples are the durations sample took, per Measure, until done
	samples map[*Measure][]time.Duration
}

// sample times one such start on m, under name (with the run's label
// appended); a nil receiver (bwrap, or no engine client) or m does
// nothing.
func (e *engineNew) sample(ctx context.Context, m *Measure, name string) {
	if e == nil || m == nil {
		return
	}
	name += "-" + e.label
	st := time.Now()
	err := e.start(ctx, name)
	d := time.Since(st)
	if err != nil {
		m.fail(err)
	} else {
		e.samples[m] = append(e.samples[m], d)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := e.cli.ContainerRemove(rctx, name, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
		m.fail(fmt.Errorf("removing %s: %w", name, err))
	}
}

// done adds the samples taken for m to it.
func (e *engineNew) done(m *Measure) {
	if e == nil || m == nil || len(e.samples[m]) == 0 {
		return
	}
	m.add(summariseSeq(e.samples[m]))
	delete(e.samples, m)
}

// start creates and starts container name and waits for its output.
func (e *engineNew) start(ctx context.Context, name string) error {
	spec := backends.DefaultSandboxSpec()
	init := true
	pids := int64(spec.PidsLimit)
	cfg := &container.Config{Image: e.image, Entrypoint: []string{"sh", "-c", "echo hi"}, Labels: map[string]string{benchLabel: e.label}}
	hc := &container.HostConfig{
		Init:           &init,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		ReadonlyRootfs: spec.ReadOnlyRootfs,
		NetworkMode:    "none",
		Tmpfs:          map[string]string{"/run/boxrt": "rw,nosuid,nodev,noexec,size=1m,mode=1777"},
		Mounts: []mount.Mount{
			{Type: mount.TypeVolume, Target: spec.MountPath},
			{Type: mount.TypeVolume, Target: "/tmp"},
		},
		Resources: container.Resources{
			Memory:     int64(spec.MemoryMB) << 20,
			MemorySwap: int64(spec.MemoryMB) << 20,
			PidsLimit:  &pids,
			NanoCPUs:   int64(spec.CPUs * 1e9),
		},
	}
	if _, err := e.cli.ContainerCreate(ctx, cfg, hc, nil, nil, name); err != nil {
		return err
	}
	att, err := e.cli.ContainerAttach(ctx, name, container.AttachOptions{Stream: true, Stdout: true})
	if err != nil {
		return err
	}
	defer att.Close()
	if err := e.cli.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
		return err
	}
	// The stream is multiplexed (no TTY): the line is read with its
	// frame header in front of it.
	line, err := bufio.NewReader(att.Reader).ReadString('\n')
	if !strings.Contains(line, "hi") {
		return fmt.Errorf("container %s printed %q, not hi: %v", name, line, err)
	}
	return nil
}
