package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Labels on every container and workspace volume boxrt creates.
const (
	LabelManaged   = "boxrt.managed"
	LabelInstance  = "boxrt.instance"
	LabelSession   = "boxrt.session"
	LabelSpec      = "boxrt.spec"
	LabelCreated   = "boxrt.created"
	LabelContainer = "boxrt.container" // on volumes: the owning container
)

// containerPrefix starts every container name; volumePrefix every workspace
// volume name and tmpVolumePrefix every /tmp volume name (followed by the
// container name).
const (
	containerPrefix = "boxrt-"
	volumePrefix    = "boxrt-ws-"
	tmpVolumePrefix = "boxrt-tmp-"
)

// pidDir holds the pid files of execs and managed processes: a small tmpfs
// of boxrt's own, so that nothing of boxrt's shows in the user's /tmp,
// workspace or home (or in a snapshot of them). Sticky and open to all, as
// /tmp was: the exec user and the managed-process user both write there,
// and neither may delete the other's files.
const (
	pidDir     = "/run/boxrt"
	pidDirOpts = "rw,nosuid,nodev,noexec,size=1m,mode=1777"
)

const cleanupTimeout = 30 * time.Second

var unsafeNameChars = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

// containerName follows the reference's scheme (sanitised id, at most 32
// characters, random suffix) so names stay readable in `docker ps` and two
// sessions whose ids sanitise alike never clash.
func containerName(sessionID string) string {
	s := strings.ToLower(strings.Trim(unsafeNameChars.ReplaceAllString(sessionID, "-"), "-"))
	if len(s) > 32 {
		s = s[:32]
	}
	if s == "" {
		s = "session"
	}
	return containerPrefix + s + "-" + randomHex(8)
}

func volumeName(container string) string { return volumePrefix + container }

func tmpVolumeName(container string) string { return tmpVolumePrefix + container }

// pidDirOf is where the pid files of container name's commands go.
func (b *Backend) pidDirOf(name string) string {
	if _, ok := b.legacy.Load(name); ok {
		return "/tmp"
	}
	return pidDir
}

// StartSession implements backends.Backend: it creates and starts the
// session's container.
func (b *Backend) StartSession(ctx context.Context, spec backends.SandboxSpec) (backends.Session, error) {
	if spec.SessionID == "" {
		return backends.Session{}, boxerr.Validation("session_id", "session_id must not be empty")
	}
	if spec.MountPath == "" {
		spec.MountPath = backends.DefaultMountPath
	}
	if spec.Image == "" {
		spec.Image = b.defaultImage
	}
	img, err := b.ensureImage(ctx, spec.Image)
	if err != nil {
		return backends.Session{}, err
	}
	owner := b.containerOwner(img)

	name := containerName(spec.SessionID)
	defer b.creating.Begin(name)()
	info := spec.Session(Name, name)
	info.CreatedAt = time.Now().UTC()
	info.LastUsedAt = info.CreatedAt

	cfg, hc, agent, err := b.containerSpec(ctx, spec, info, owner)
	if err == nil {
		err = recheckBinds(info)
	}
	if err != nil {
		b.removeSession(ctx, name)
		return backends.Session{}, err
	}
	if _, err := b.cli.ContainerCreate(ctx, cfg, hc, nil, nil, name); err != nil {
		if !cerrdefs.IsConflict(err) {
			// The engine may have created the workspace volume before
			// failing; a name conflict, though, means the name is not ours.
			b.removeSession(ctx, name)
		} else {
			_ = b.removeQuota(name)
		}
		return backends.Session{}, b.apiError("creating container for session "+spec.SessionID, err)
	}
	// The engine binds host paths at start, following symlinks: check
	// again as late as possible.
	if err := recheckBinds(info); err != nil {
		b.removeSession(ctx, name)
		return backends.Session{}, err
	}
	var link *agentLink
	if agent {
		// Listening before the start: the agent dials at once.
		if link, err = b.addLink(info, b.agentDir(name)); err != nil {
			b.removeSession(ctx, name)
			return backends.Session{}, err
		}
	}
	if len(spec.Secrets) > 0 {
		b.egMu.Lock()
		b.egSecrets[name] = spec.Secrets
		b.egMu.Unlock()
	}
	if err := b.cli.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
		b.removeSession(ctx, name)
		return backends.Session{}, b.apiError("starting container for session "+spec.SessionID, err)
	}
	if err := b.attachNet(ctx, info); err != nil {
		b.removeSession(ctx, name)
		return backends.Session{}, err
	}
	if link != nil {
		link.mu.Lock()
		err := link.accept(ctx)
		link.mu.Unlock()
		if err != nil {
			b.removeSession(ctx, name)
			return backends.Session{}, err
		}
	}
	return info, nil
}

// containerSpec is the container of session info: its mounts, labels and
// hardening and, where the agent serves, the agent as its entrypoint
// (agent says so).
func (b *Backend) containerSpec(ctx context.Context, spec backends.SandboxSpec, info backends.Session, o owner) (cfg *container.Config, hc *container.HostConfig, agent bool, err error) {
	name := info.BackendSessionID
	mounts, err := b.mounts(ctx, spec, name, o)
	if err != nil {
		return nil, nil, false, err
	}
	labels, err := b.labels(info)
	if err != nil {
		return nil, nil, false, err
	}
	cfg = &container.Config{
		Image:  spec.Image,
		User:   b.user,
		Labels: labels,
		// Overriding the entrypoint (not just the command) keeps an image's
		// own ENTRYPOINT from swallowing the keep-alive loop (or the agent).
		Entrypoint: []string{"sh", "-c", keepAlive},
	}
	if hc, err = b.hostConfig(ctx, spec, mounts); err != nil {
		return nil, nil, false, err
	}
	if agent, err = b.usesAgent(ctx, spec.Sandbox); err != nil || !agent {
		return cfg, hc, false, err
	}
	am, err := b.agentMounts(name)
	if err != nil {
		return nil, nil, false, err
	}
	agentHostConfig(hc, am)
	cfg.Entrypoint = agentEntrypoint
	labels[LabelAgent] = "1"
	return cfg, hc, true, nil
}

// hostConfig is the engine's side of the session's container: runtime,
// init, dropped capabilities, security options, limits, network and mounts.
func (b *Backend) hostConfig(ctx context.Context, spec backends.SandboxSpec, mounts []mount.Mount) (*container.HostConfig, error) {
	secOpts, err := b.securityOpts(ctx, spec.Sandbox)
	if err != nil {
		return nil, err
	}
	init := true
	rt := b.runtimeFor(spec.Sandbox)
	pids := b.PidsCgroupLimit(spec.Sandbox)
	hc := &container.HostConfig{
		Runtime:        rt,
		Init:           &init,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    secOpts,
		ReadonlyRootfs: spec.ReadOnlyRootfs,
		Mounts:         mounts,
		Resources: container.Resources{
			Memory:     int64(spec.MemoryMB) << 20,
			MemorySwap: int64(spec.MemoryMB) << 20, // equal to Memory: no swap
			PidsLimit:  &pids,
		},
	}
	if spec.PidsLimit <= 0 {
		hc.PidsLimit = nil
	}
	if spec.MemoryMB <= 0 {
		hc.Memory, hc.MemorySwap = 0, 0
	}
	if b.cpuLimit && spec.CPUs > 0 {
		if err := b.checkCPUs(ctx, spec.CPUs); err != nil {
			return nil, err
		}
		hc.NanoCPUs = int64(spec.CPUs * 1e9)
	}
	// With network too: the egress proxy is attached once it runs
	// (network.go).
	if err := b.checkEgress(spec.Sandbox); err != nil {
		return nil, err
	}
	hc.NetworkMode = "none"
	if spec.Network.Egress() {
		// Not the host's resolver, which may be a loopback address the
		// container would ask itself: port 53 of any other address
		// reaches the egress proxy's resolver.
		hc.DNS = []string{egressResolver}
	}
	hc.Tmpfs = map[string]string{pidDir: pidDirOpts}
	return hc, nil
}

// recheckBinds re-verifies every host path the session binds (see
// backends.RecheckHostPath); the paths were resolved when they were
// checked, so any difference now is a swap.
func recheckBinds(info backends.Session) error {
	if info.HostPath != "" && info.HostPathMode != backends.MountNone {
		if err := backends.RecheckHostPath("host_path", info.HostPath); err != nil {
			return err
		}
	}
	for i, m := range info.ExtraMounts {
		if m.Mode == backends.MountNone {
			continue
		}
		if err := backends.RecheckHostPath(fmt.Sprintf("extra_mounts[%d].host_path", i), m.HostPath); err != nil {
			return err
		}
	}
	return nil
}

// checkCPUs refuses a CPU limit above the engine's CPU count, which the
// engine would refuse with an error that names no field.
func (b *Backend) checkCPUs(ctx context.Context, cpus float64) error {
	b.ncpuMu.Lock()
	defer b.ncpuMu.Unlock()
	if b.ncpu == 0 {
		info, err := b.cli.Info(ctx)
		if err != nil {
			return b.apiError("reading the engine's CPU count", err)
		}
		b.ncpu = info.NCPU
	}
	if cpus > float64(b.ncpu) {
		return boxerr.Validation("cpus", "cpus must be at most %d (the CPUs of the Docker engine's host), got %v", b.ncpu, cpus)
	}
	return nil
}

// labels renders the container labels that Adopt reads back.
func (b *Backend) labels(info backends.Session) (map[string]string, error) {
	// The sandbox is all Adopt needs to rebuild the Session without any
	// state outside the engine.
	raw, err := json.Marshal(info.Sandbox)
	if err != nil {
		return nil, boxerr.Failure("docker backend error: encoding session labels: %v", err).Wrap(err)
	}
	return map[string]string{
		LabelManaged:  "true",
		LabelInstance: b.instance,
		LabelSession:  info.SessionID,
		LabelSpec:     string(raw),
		LabelCreated:  info.CreatedAt.Format(time.RFC3339Nano),
	}, nil
}

// infoFromLabels is the inverse of labels.
func infoFromLabels(name string, labels map[string]string) (backends.Session, error) {
	var s backends.Sandbox
	if err := json.Unmarshal([]byte(labels[LabelSpec]), &s); err != nil {
		return backends.Session{}, fmt.Errorf("container %s: bad %s label: %w", name, LabelSpec, err)
	}
	id := labels[LabelSession]
	if id == "" {
		return backends.Session{}, fmt.Errorf("container %s: no %s label", name, LabelSession)
	}
	created, err := time.Parse(time.RFC3339Nano, labels[LabelCreated])
	if err != nil {
		return backends.Session{}, fmt.Errorf("container %s: bad %s label: %w", name, LabelCreated, err)
	}
	return backends.Session{
		SessionID:        id,
		BackendName:      Name,
		BackendSessionID: name,
		Sandbox:          s,
		CreatedAt:        created,
		LastUsedAt:       time.Now().UTC(),
	}, nil
}

// owner is the numeric uid/gid the sandbox runs as, when known; used to hand
// a workspace directory boxrt just created over to the sandbox user.
type owner struct {
	uid, gid int
	known    bool
}

// containerOwner resolves the user the container will run as: the explicit
// Config.User, else the image's USER. Only numeric users can be resolved
// without reading the image's /etc/passwd.
func (b *Backend) containerOwner(img image.InspectResponse) owner {
	u := b.user
	if u == "" && img.Config != nil {
		u = img.Config.User
	}
	uidS, gidS, hasGID := strings.Cut(u, ":")
	uid, err := strconv.Atoi(uidS)
	if err != nil || uid <= 0 {
		return owner{}
	}
	o := owner{uid: uid, gid: -1, known: true}
	if hasGID {
		if gid, err := strconv.Atoi(gidS); err == nil {
			o.gid = gid
		}
	}
	return o
}

// mounts builds the workspace mount (host bind or named volume) and the
// extra binds. The runtime has already checked host paths against the
// allow-list.
func (b *Backend) mounts(ctx context.Context, spec backends.SandboxSpec, name string, o owner) ([]mount.Mount, error) {
	var out []mount.Mount
	if spec.HostPath != "" && spec.HostPathMode != backends.MountNone {
		m, err := bindMount("host_path", spec.HostPath, spec.MountPath, spec.HostPathMode, o)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	} else if quota := b.effectiveQuota(spec); quota > 0 {
		m, err := b.quotaWorkspace(ctx, name, quota, spec.MountPath, o)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	} else {
		// A named volume rather than a container-layer directory: it
		// survives a boxrt restart, works with a read-only rootfs and with
		// remote engines, and inherits the image's ownership of the mount
		// path so a non-root sandbox user can write to it.
		out = append(out, b.volumeMount(spec, name, volumeName(name), spec.MountPath))
	}
	for i, em := range spec.ActiveExtraMounts() {
		m, err := bindMount(fmt.Sprintf("extra_mounts[%d].host_path", i), em.HostPath, em.MountPath, em.Mode, o)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if slices.ContainsFunc(out, func(m mount.Mount) bool { return path.Clean(m.Target) == "/tmp" }) {
		return out, nil // the caller's own mount is /tmp
	}
	tmp, err := b.tmpMount(ctx, spec, name)
	if err != nil {
		return nil, err
	}
	return append(out, tmp), nil
}

// volumeMount is a named volume of the session's, labelled so that
// collectVolumes finds it once its container is gone.
func (b *Backend) volumeMount(spec backends.SandboxSpec, name, volume, target string) mount.Mount {
	return mount.Mount{
		Type:   mount.TypeVolume,
		Source: volume,
		Target: target,
		VolumeOptions: &mount.VolumeOptions{Labels: map[string]string{
			LabelManaged:   "true",
			LabelInstance:  b.instance,
			LabelSession:   spec.SessionID,
			LabelContainer: name,
		}},
	}
}

// tmpMount is the session's /tmp. A tmpfs would be lost when the container
// stops (suspend) and cannot be read through the engine (snapshot, fork);
// a read-only rootfs has no other place for it, and gVisor keeps a
// writable one's changes in memory. So /tmp is the session's own storage,
// like its workspace: a disk of tmp_size_mb where boxrt makes disks, else
// a named volume (which takes the image's /tmp, its mode 1777 included).
func (b *Backend) tmpMount(ctx context.Context, spec backends.SandboxSpec, name string) (mount.Mount, error) {
	if b.stateDir != "" && b.localEngine() && (b.defaultQuotaMB > 0 || spec.WorkspaceQuotaMB > 0) {
		return b.quotaTmp(ctx, name)
	}
	return b.volumeMount(spec, name, tmpVolumeName(name), "/tmp"), nil
}

// bindMount prepares one host bind. A missing rw directory is created (and
// given to the sandbox user, since a root-owned 0755 directory would be
// read-only to it); a missing ro one is an error, as binding an empty
// directory read-only is never what the caller meant.
func bindMount(field, host, target string, mode backends.MountMode, o owner) (mount.Mount, error) {
	if _, err := os.Stat(host); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return mount.Mount{}, boxerr.Failure("cannot use host path %s: %v", host, err).Wrap(err)
		}
		if mode != backends.MountRW {
			return mount.Mount{}, boxerr.Validation(field, "%s %s does not exist (read-only mounts are not created)", field, host).With("path", host)
		}
		if err := backends.EnsureDir(host); err != nil {
			return mount.Mount{}, err
		}
		if o.known && os.Geteuid() == 0 {
			if err := os.Chown(host, o.uid, o.gid); err != nil {
				return mount.Mount{}, boxerr.Failure("cannot hand %s to uid %d: %v", host, o.uid, err).Wrap(err)
			}
		}
	}
	return mount.Mount{
		Type:     mount.TypeBind,
		Source:   host,
		Target:   target,
		ReadOnly: mode == backends.MountRO,
	}, nil
}

// ensureImage returns the image's metadata, pulling it when the engine does
// not have it. No registry may be reachable, so a failed pull ends in an
// error that says how to provide the image instead.
func (b *Backend) ensureImage(ctx context.Context, ref string) (image.InspectResponse, error) {
	img, err := b.cli.ImageInspect(ctx, ref)
	if err == nil {
		return img, nil
	}
	if !cerrdefs.IsNotFound(err) {
		return image.InspectResponse{}, b.apiError("inspecting image "+ref, err)
	}
	pullErr := b.pull(ctx, ref)
	if pullErr == nil {
		if img, err = b.cli.ImageInspect(ctx, ref); err == nil {
			return img, nil
		}
		pullErr = err
	}
	if isContextErr(pullErr) {
		return image.InspectResponse{}, boxerr.Failure("docker backend error: pulling image %s: %v", ref, pullErr).Wrap(pullErr)
	}
	hint := "build it locally or load it with `docker load -i <archive>`"
	if ref == DefaultImage || ref == b.defaultImage {
		hint = "build it with scripts/build-image, or load it with `docker load -i <archive>`"
	}
	return image.InspectResponse{}, boxerr.Failure(
		"image %s is not available on the Docker engine and could not be pulled (%v); %s, then retry",
		ref, pullErr, hint).With("image", ref).Wrap(pullErr)
}

// pull runs an image pull to completion. Pull failures arrive inside the
// progress stream, not as the call's error.
func (b *Backend) pull(ctx context.Context, ref string) error {
	rc, err := b.cli.ImagePull(ctx, ref, image.PullOptions{})
	if err != nil {
		return err
	}
	defer rc.Close()
	dec := json.NewDecoder(rc)
	for {
		var msg struct {
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if msg.ErrorDetail.Message != "" {
			return errors.New(msg.ErrorDetail.Message)
		}
		if msg.Error != "" {
			return errors.New(msg.Error)
		}
	}
}

// Alive implements backends.Backend. Only the engine's word counts: when
// it cannot answer (restarting, down) the container is not known to be
// gone, and the runtime must not replace the session over an outage.
func (b *Backend) Alive(ctx context.Context, info backends.Session) bool {
	c, err := b.cli.ContainerInspect(ctx, info.BackendSessionID)
	if err != nil {
		return !cerrdefs.IsNotFound(err) && b.engineDown(ctx)
	}
	return c.State != nil && c.State.Running
}

// engineDown reports whether the engine does not answer at all (as opposed
// to answering with an error).
func (b *Backend) engineDown(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	_, err := b.cli.Ping(ctx)
	return err != nil
}

// StopSession implements backends.Backend: the container and its workspace
// volume are removed; a session that is already gone is not an error.
func (b *Backend) StopSession(ctx context.Context, info backends.Session) error {
	name := info.BackendSessionID
	if name == "" {
		return boxerr.Validation("backend_session_id", "session %s has no container name", info.SessionID)
	}
	c, err := b.cli.ContainerInspect(ctx, name)
	switch {
	case err == nil:
		if c.Config == nil || c.Config.Labels[LabelInstance] != b.instance {
			return boxerr.Failure("docker backend error: refusing to remove container %s: it does not belong to this boxrt instance", name)
		}
	case !cerrdefs.IsNotFound(err):
		return b.apiError("inspecting container "+name, err)
	}
	b.prestarts.Drop(name)
	b.dropLink(name)
	b.forgetNet(name)
	if err := b.removeContainer(ctx, name); err != nil {
		return err
	}
	b.legacy.Delete(name)
	b.dropMarks(name)
	return errors.Join(b.removeVolumes(ctx, name), b.removeQuota(name), b.removeAgentDir(name))
}

func (b *Backend) removeContainer(ctx context.Context, name string) error {
	err := b.cli.ContainerRemove(ctx, name, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	if cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "already in progress") {
		// Another caller is removing it; wait for it to be gone so the
		// volume can be removed after it.
		for i := 0; i < 100; i++ {
			if _, ierr := b.cli.ContainerInspect(ctx, name); cerrdefs.IsNotFound(ierr) {
				return nil
			}
			if sleepCtx(ctx, 100*time.Millisecond) != nil {
				break
			}
		}
	}
	return b.apiError("removing container "+name, err)
}

// removeVolumes removes the named volumes of container name (workspace,
// /tmp); those it does not have are no error.
func (b *Backend) removeVolumes(ctx context.Context, name string) error {
	return errors.Join(b.removeVolume(ctx, volumeName(name)), b.removeVolume(ctx, tmpVolumeName(name)))
}

func (b *Backend) removeVolume(ctx context.Context, name string) error {
	var err error
	for i := 0; i < 10; i++ {
		err = b.cli.VolumeRemove(ctx, name, true)
		if err == nil || cerrdefs.IsNotFound(err) {
			return nil
		}
		// "volume is in use" right after the container's removal clears
		// once the engine has released the mount.
		if !cerrdefs.IsConflict(err) || sleepCtx(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	return b.apiError("removing volume "+name, err)
}

// removeSession is best-effort cleanup after a failed start.
func (b *Backend) removeSession(ctx context.Context, name string) {
	ctx, cancel := cleanupContext(ctx, cleanupTimeout)
	defer cancel()
	b.dropLink(name)
	b.forgetNet(name)
	if b.removeContainer(ctx, name) == nil {
		_ = b.removeVolumes(ctx, name)
		_ = b.removeQuota(name)
		_ = b.removeAgentDir(name)
	}
}

// ownContainers lists this installation's containers, stopped ones too, in
// one engine call.
func (b *Backend) ownContainers(ctx context.Context) ([]container.Summary, error) {
	list, err := b.cli.ContainerList(ctx, container.ListOptions{
		All: true,
		Filters: filters.NewArgs(
			filters.Arg("label", LabelManaged+"=true"),
			filters.Arg("label", LabelInstance+"="+b.instance),
		),
	})
	if err != nil {
		return nil, b.apiError("listing containers", err)
	}
	return list, nil
}

// Existing implements backends.Census with one engine list call: the
// containers of this installation, stopped (suspended) ones included.
func (b *Backend) Existing(ctx context.Context) (map[string]bool, error) {
	list, err := b.ownContainers(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(list))
	for _, c := range list {
		if c.Labels[LabelInstance] == b.instance && len(c.Names) > 0 {
			out[strings.TrimPrefix(c.Names[0], "/")] = true
		}
	}
	return out, nil
}

// Adopt implements backends.Backend. Running containers of this instance are
// returned, suspended ones (see Suspend) too, stopped and with State
// suspended; other stopped ones are restarted when persistent (a host reboot must
// not lose a persistent workspace) and their host paths still pass
// RecheckHostPath, and removed otherwise, as the reference's --rm would
// have. Refused restarts come back as an error next to the adopted sessions. Orphaned volumes of this instance are removed.
// Containers with unreadable labels are left alone.
func (b *Backend) Adopt(ctx context.Context) ([]backends.Session, error) {
	list, err := b.ownContainers(ctx)
	if err != nil {
		return nil, err
	}
	var out []backends.Session
	var refused []error
	keep := map[string]bool{}
	for _, c := range list {
		if c.Labels[LabelInstance] != b.instance || c.Labels[LabelManaged] != "true" || len(c.Names) == 0 {
			continue
		}
		name := strings.TrimPrefix(c.Names[0], "/")
		keep[name] = true
		if !slices.ContainsFunc(c.Mounts, func(m container.MountPoint) bool { return m.Destination == "/tmp" }) {
			// Made before /tmp and pidDir were the session's own.
			b.legacy.Store(name, true)
		}
		info, infoErr := infoFromLabels(name, c.Labels)
		if infoErr == nil {
			info = b.applyClaim(info)
			if err := b.relisten(ctx, info, c.Labels, c.Mounts); err != nil {
				refused = append(refused, err)
			}
		}
		if infoErr == nil && b.suspended(name) {
			// A suspended session stays stopped until it is needed; a
			// marked container still running is a suspension a crash
			// interrupted.
			if c.State == container.StateRunning {
				timeout := suspendStopSec
				if err := b.cli.ContainerStop(ctx, name, container.StopOptions{Timeout: &timeout}); err != nil {
					refused = append(refused, fmt.Errorf("suspending container %s again: %w", name, err))
					continue
				}
			}
			info.State = backends.StateSuspended
			out = append(out, info)
			continue
		}
		switch c.State {
		case container.StateRunning:
			if infoErr == nil {
				if err := b.killOrphans(ctx, name); err != nil {
					refused = append(refused, err)
				}
				// Its namespace kept the rules; the proxy that served it
				// went with the earlier boxrt.
				if err := b.attachNet(ctx, info); err != nil {
					refused = append(refused, fmt.Errorf("session %s (container %s) has no network: %w", info.SessionID, name, err))
				}
				out = append(out, info)
			}
		case container.StateExited, container.StateDead, container.StateCreated:
			// A container never started is a creation: this process's
			// own, or one an earlier process was killed in the middle of
			// (nobody was told of that session; it is removed unless
			// persistent).
			if infoErr != nil || (c.State == container.StateCreated && b.creating.Has(name)) {
				continue
			}
			if info.Persistent {
				started, err := b.restartPersistent(ctx, name, info)
				if err != nil {
					refused = append(refused, err)
				}
				if started {
					out = append(out, info)
				}
				continue
			}
			b.dropLink(name)
			if b.removeContainer(ctx, name) == nil {
				delete(keep, name)
				_ = b.removeVolumes(ctx, name)
				_ = b.removeQuota(name)
				_ = b.removeAgentDir(name)
			}
		}
	}
	b.collectVolumes(ctx, keep)
	b.collectQuotas(keep)
	b.collectMarks(keep)
	b.collectAgentDirs(keep)
	if len(refused) > 0 {
		return out, boxerr.Failure("docker backend: adopting: %v", errors.Join(refused...)).Wrap(errors.Join(refused...))
	}
	return out, nil
}

// restartPersistent starts the stopped container name of a persistent
// session again (Adopt). Restarting re-binds the host paths: a path
// swapped for a symlink while boxrt was down must not be followed, so the
// container is then left stopped for an operator to look at. started
// says whether it runs (err may still say its network is missing).
func (b *Backend) restartPersistent(ctx context.Context, name string, info backends.Session) (started bool, err error) {
	if err := recheckBinds(info); err != nil {
		return false, fmt.Errorf("not restarting persistent session %s (container %s): %w", info.SessionID, name, err)
	}
	if b.hasQuota(name) {
		if err := b.mountQuota(name); err != nil {
			return false, fmt.Errorf("not restarting persistent session %s (container %s): %w", info.SessionID, name, err)
		}
	}
	if b.cli.ContainerStart(ctx, name, container.StartOptions{}) != nil {
		return false, nil
	}
	if err := b.attachNet(ctx, info); err != nil {
		return true, fmt.Errorf("persistent session %s (container %s) has no network: %w", info.SessionID, name, err)
	}
	return true, nil
}

// killOrphans kills the managed processes a previous boxrt left running in
// a container it is adopting (see orphanScript).
func (b *Backend) killOrphans(ctx context.Context, name string) error {
	users := []string{""}
	if b.processUser != "" {
		users = append(users, b.processUser)
	}
	for _, u := range users {
		// /tmp: where the pid files of containers made before pidDir are.
		if err := b.runHelper(ctx, name, u, []string{"sh", "-c", orphanScript, "boxrt-orphans", pidDir, "/tmp"}); err != nil {
			return fmt.Errorf("killing orphaned processes in %s: %w", name, err)
		}
	}
	return nil
}

// collectVolumes removes this instance's volumes (workspace, /tmp) whose container
// is gone (a StopSession that failed half-way, a crash), except those of a
// session being created right now. A volume still in use is refused by the
// engine too.
func (b *Backend) collectVolumes(ctx context.Context, keep map[string]bool) {
	vols, err := b.cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelInstance+"="+b.instance),
	)})
	if err != nil {
		return
	}
	for _, v := range vols.Volumes {
		if v == nil || v.Labels[LabelInstance] != b.instance || keep[v.Labels[LabelContainer]] ||
			b.creating.Has(v.Labels[LabelContainer]) ||
			!strings.HasPrefix(v.Name, volumePrefix) && !strings.HasPrefix(v.Name, tmpVolumePrefix) {
			continue
		}
		_ = b.cli.VolumeRemove(ctx, v.Name, false)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
