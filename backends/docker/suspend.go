package docker

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/docker/docker/api/types/container"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/atomicfile"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.Suspender = (*Backend)(nil)

// suspendedSuffix names a suspension mark: an empty file
// <StateDir>/docker/<instance>/<container>.suspended. Container labels
// cannot change after creation, so the mark lives beside the quota
// directories (which are directories; collectQuotas skips files).
const suspendedSuffix = ".suspended"

// suspendStopSec is how long a suspended container's processes get between
// SIGTERM and SIGKILL.
const suspendStopSec = 3

func (b *Backend) suspendMark(name string) string {
	return filepath.Join(b.stateDir, "docker", b.instance, name+suspendedSuffix)
}

func (b *Backend) suspended(name string) bool {
	if b.stateDir == "" {
		return false
	}
	_, err := os.Stat(b.suspendMark(name))
	return err == nil
}

// Suspend implements backends.Suspender: the mark is written first (temp
// name, then rename), then the container is stopped. The container keeps
// its writable layer and its workspace volume; a crash between the two
// leaves a marked running container, which Adopt stops.
func (b *Backend) Suspend(ctx context.Context, info backends.Session) error {
	if b.stateDir == "" {
		return boxerr.Failure("docker backend: suspending needs a state directory")
	}
	name := info.BackendSessionID
	if err := b.owned(ctx, info); err != nil {
		return err
	}
	mark := b.suspendMark(name)
	if err := os.MkdirAll(filepath.Dir(mark), 0o700); err != nil {
		return boxerr.Failure("docker backend: suspending %s: %v", name, err).Wrap(err)
	}
	if err := atomicfile.Write(mark, []byte(info.SessionID+"\n"), 0o600); err != nil {
		return backends.StateDirError("docker backend: suspending "+name, err)
	}
	b.prestarts.Drop(name)
	b.suspendLink(name)
	b.detachNet(name)
	timeout := suspendStopSec
	if err := b.cli.ContainerStop(ctx, name, container.StopOptions{Timeout: &timeout}); err != nil {
		return b.apiError("stopping container "+name, err)
	}
	return nil
}

// Resume implements backends.Suspender: the host paths are checked again
// (a path swapped for a symlink while suspended must not be followed), the
// quota disk mounted when a reboot unmounted it, the container started,
// and then the mark removed.
func (b *Backend) Resume(ctx context.Context, info backends.Session) error {
	name := info.BackendSessionID
	if err := b.owned(ctx, info); err != nil {
		return err
	}
	if err := b.resumeLink(name); err != nil {
		return err
	}
	if err := b.startStopped(ctx, info); err != nil {
		return err
	}
	if err := os.Remove(b.suspendMark(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return boxerr.Failure("docker backend: resuming %s: %v", name, err).Wrap(err)
	}
	return nil
}

// startStopped starts a stopped container after checking its host paths
// again and mounting its quota disk when a reboot unmounted it.
func (b *Backend) startStopped(ctx context.Context, info backends.Session) error {
	name := info.BackendSessionID
	if err := recheckBinds(info); err != nil {
		return err
	}
	if b.hasQuota(name) {
		if err := b.mountQuota(name); err != nil {
			return err
		}
	}
	if err := b.cli.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
		return b.apiError("starting container "+name, err)
	}
	return b.attachNet(ctx, info)
}

var _ backends.Restarter = (*Backend)(nil)

// Restart implements backends.Restarter: a container the engine stopped
// (its own restart, a host reboot, the container's memory limit) is started
// the way a suspended one is resumed, host paths and quota disk included.
func (b *Backend) Restart(ctx context.Context, info backends.Session) error {
	return b.Resume(ctx, info)
}

// owned refuses a container that is missing or not this instance's.
func (b *Backend) owned(ctx context.Context, info backends.Session) error {
	_, err := b.inspectOwned(ctx, info)
	return err
}

// inspectOwned is owned that also answers the container's inspection.
func (b *Backend) inspectOwned(ctx context.Context, info backends.Session) (container.InspectResponse, error) {
	name := info.BackendSessionID
	c, err := b.cli.ContainerInspect(ctx, name)
	if err != nil {
		return c, b.sessionError(info, "inspecting container "+name, err)
	}
	if c.Config == nil || c.Config.Labels[LabelInstance] != b.instance {
		return c, boxerr.Failure("docker backend error: container %s does not belong to this boxrt instance", name)
	}
	return c, nil
}

// dropMarks forgets a container's suspension mark and claim record (the
// container is being removed).
func (b *Backend) dropMarks(name string) {
	if b.stateDir != "" {
		_ = os.Remove(b.suspendMark(name))
		_ = os.Remove(b.claimPath(name))
	}
}

// collectMarks removes the suspension marks and claim records of
// containers that are gone.
func (b *Backend) collectMarks(keep map[string]bool) {
	if b.stateDir == "" {
		return
	}
	dir := filepath.Join(b.stateDir, "docker", b.instance)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := strings.TrimSuffix(strings.TrimSuffix(e.Name(), suspendedSuffix), claimSuffix)
		if name != e.Name() && !e.IsDir() && strings.HasPrefix(name, containerPrefix) && !keep[name] {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
