package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/versions"
	"github.com/docker/docker/client"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// Name is the backend's wire name.
const Name = "docker"

// DefaultImage is the image a session gets when neither the spec nor the
// Config names one.
const DefaultImage = "boxrt-sandbox:latest"

// DefaultTmpSizeMB is the size of the /tmp disk of a read-only-rootfs
// session when Config.TmpSizeMB is zero.
const DefaultTmpSizeMB = 64

// minAPIVersion is the oldest Engine API this backend works with: mount
// objects with volume labels (1.30) and exec environment/working dirs.
const minAPIVersion = "1.30"

const probeTimeout = 5 * time.Second

// Config configures the Docker backend.
type Config struct {
	// InstanceID is the stable id of this boxrt installation; containers are
	// labelled boxrt.instance=<InstanceID> and Adopt only ever looks at those.
	InstanceID string
	// DefaultImage is used when Spec.Image is empty; default
	// "boxrt-sandbox:latest".
	DefaultImage string
	// User is "" or "auto" (the image's configured USER, root when it sets
	// none) or an explicit "uid[:gid]" (names are accepted too).
	User string
	// CPULimitEnabled applies Spec.CPUs as a NanoCPUs limit (the reference's
	// docker.cpu_limit_enabled; boxrt's configuration turns it on by
	// default).
	CPULimitEnabled bool
	// TmpSizeMB is the size of the /tmp disk (ext4 image, like a quota
	// workspace's; at least MinWorkspaceQuotaMB) given to read-only-rootfs
	// sessions where boxrt makes disks: a local engine, a StateDir and
	// workspace quotas on. Elsewhere /tmp is a named volume, unbounded
	// like the workspace's. Default 64, at most MaxTmpSizeMB.
	TmpSizeMB int
	// ProcessUser is "" (managed processes run as the sessions' user) or
	// "uid[:gid]": managed processes then run as that user, so execs
	// cannot read their environment from /proc/<pid>/environ.
	ProcessUser string
	// StateDir holds the disk images of quota-bounded workspaces and /tmp.
	StateDir string
	// DefaultWorkspaceQuotaMB bounds the workspace of a session whose spec
	// sets no workspace_quota_mb; 0 leaves such workspaces unbounded. It
	// applies only when the engine is local.
	DefaultWorkspaceQuotaMB int
	// Runtime is the engine runtime of every session ("" for the engine's
	// default); "runsc" runs them under gVisor.
	Runtime string
	// GVisorRuntime serves specs asking for isolation "gvisor"; "" refuses
	// them.
	GVisorRuntime string
	// AgentBinary is a static boxrt binary on the engine's host, bound
	// read-only into every session's container as its entrypoint (the
	// session agent, see agent.go). "" (or no StateDir, or a remote
	// engine) runs commands through Engine execs instead.
	AgentBinary string
	// Egress is boxrt's egress proxy, attached to the network namespace
	// of every container with network (network.go); nil refuses them.
	Egress *egress.Proxy
}

// MaxTmpSizeMB bounds Config.TmpSizeMB.
const MaxTmpSizeMB = 16 << 10

// Backend runs sessions as Docker containers. It is safe for concurrent use.
type Backend struct {
	cli          *client.Client
	instance     string
	defaultImage string
	user         string // explicit user, "" for the image's
	cpuLimit     bool
	tmpSizeMB    int
	stateDir     string
	processUser  string // "" for the sessions' user

	ncpuMu sync.Mutex // guards ncpu, read from the engine on first use
	ncpu   int
	// defaultQuotaMB is Config.DefaultWorkspaceQuotaMB.
	defaultQuotaMB int

	runtime, gvisorRuntime string
	runtimesMu             sync.Mutex          // guards runtimesOK, engineDefaultRuntime, runtimeArgs
	runtimesOK             bool                // the engine has every configured runtime
	engineDefaultRuntime   string              // as the engine reported it, "" until probed
	runtimeArgs            map[string][]string // the engine's runtimes and their registered arguments, nil until read

	// egress is Config.Egress; egSessions are the attached containers'
	// egress sessions and egSecrets their secrets (memory only), by
	// container name (network.go).
	egress     *egress.Proxy
	egMu       sync.Mutex
	egSessions map[string]*egress.Session
	egSecrets  map[string][]egress.Secret

	secOptsMu sync.Mutex // guards secOpts
	secOpts   []string   // containers' SecurityOpt, nil until worked out (seccomp.go)

	fileSystem // the file API (files.go)

	disks *diskImages // makes the sessions' disk images (quota.go)

	agentBinary string   // Config.AgentBinary, symlinks resolved; "" when not usable
	agentOff    string   // why a configured agent binary is not used
	links       sync.Map // container name → *agentLink or noAgent (agent.go)

	// legacy holds the adopted containers an earlier boxrt made without
	// pidDir (container name → true): their pid files go to /tmp.
	legacy sync.Map

	prestarts backends.Prestarts[*prestarted] // execs started ahead of a container's next plain exec (prestart.go)
	creating  backends.Creating               // containers StartSession is making (Adopt leaves them)
	// background bounds the work started for a later call (a prestarted
	// exec); Close cancels it.
	background       context.Context
	cancelBackground context.CancelFunc
}

var _ backends.Backend = (*Backend)(nil)

var userPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$`)

// New builds a backend from cfg and the DOCKER_HOST/DOCKER_* environment. It
// does no I/O: an unreachable engine shows up in Probe, not here.
func New(cfg Config) (*Backend, error) {
	if strings.TrimSpace(cfg.InstanceID) == "" {
		return nil, boxerr.Validation("instance_id", "docker backend: instance id must not be empty")
	}
	user := strings.TrimSpace(cfg.User)
	if user == "auto" {
		user = ""
	}
	if user != "" && !userPattern.MatchString(user) {
		return nil, boxerr.Validation("docker.user", "docker backend: user must be \"auto\" or \"uid[:gid]\", got %q", cfg.User)
	}
	procUser := strings.TrimSpace(cfg.ProcessUser)
	if procUser != "" && !userPattern.MatchString(procUser) {
		return nil, boxerr.Validation("docker.process_user", "docker backend: process user must be \"\" or \"uid[:gid]\", got %q", cfg.ProcessUser)
	}
	if cfg.TmpSizeMB < 0 || cfg.TmpSizeMB > MaxTmpSizeMB {
		return nil, boxerr.Validation("docker.tmp_size_mb", "docker backend: tmp size must be between 0 and %d, got %d", MaxTmpSizeMB, cfg.TmpSizeMB)
	}
	if q := cfg.DefaultWorkspaceQuotaMB; q != 0 && (q < MinWorkspaceQuotaMB || q > backends.MaxWorkspaceQuotaMB) {
		return nil, boxerr.Validation("docker.workspace_quota_mb", "docker backend: default workspace quota must be 0 or between %d and %d, got %d",
			MinWorkspaceQuotaMB, backends.MaxWorkspaceQuotaMB, q)
	}
	img := strings.TrimSpace(cfg.DefaultImage)
	if img == "" {
		img = DefaultImage
	}
	tmp := cfg.TmpSizeMB
	if tmp == 0 {
		tmp = DefaultTmpSizeMB
	}
	agentBin, agentOff, err := agentBinary(cfg.AgentBinary)
	if err != nil {
		return nil, err
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, boxerr.BackendUnavailable("docker backend: invalid Docker client settings (DOCKER_HOST, DOCKER_CERT_PATH, DOCKER_API_VERSION): %v", err).Wrap(err)
	}
	b := &Backend{
		cli:            cli,
		instance:       cfg.InstanceID,
		defaultImage:   img,
		user:           user,
		cpuLimit:       cfg.CPULimitEnabled,
		tmpSizeMB:      tmp,
		stateDir:       cfg.StateDir,
		processUser:    procUser,
		defaultQuotaMB: cfg.DefaultWorkspaceQuotaMB,
		runtime:        strings.TrimSpace(cfg.Runtime),
		gvisorRuntime:  strings.TrimSpace(cfg.GVisorRuntime),
		agentBinary:    agentBin,
		agentOff:       agentOff,
		egress:         cfg.Egress,
		egSessions:     map[string]*egress.Session{},
		egSecrets:      map[string][]egress.Secret{},
	}
	b.fileSystem = newFileSystem(b)
	b.disks = newDiskImages(b.templateDir(), cfg.DefaultWorkspaceQuotaMB, b.tmpDiskMB())
	b.background, b.cancelBackground = context.WithCancel(context.Background())
	return b, nil
}

// Close releases the client's connections, which ends the prestarted
// execs, and the agents' connections and sockets, and removes the disk
// templates. Sessions keep running:
// their agents dial again until a boxrt listens at the same path.
func (b *Backend) Close() error {
	b.cancelBackground()
	b.prestarts.EndAll()
	b.links.Range(func(name, _ any) bool {
		b.dropLink(name.(string))
		return true
	})
	b.egMu.Lock()
	for name, es := range b.egSessions {
		es.Close()
		delete(b.egSessions, name)
	}
	b.egMu.Unlock()
	b.disks.close()
	return b.cli.Close()
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return Name }

// DefaultImage implements backends.Backend.
func (b *Backend) DefaultImage() string { return b.defaultImage }

// Describe implements backends.Backend.
func (b *Backend) Describe() backends.Description {
	d := backends.Description{
		EnforcedLimits:  []string{"memory", "pids"},
		Isolation:       "container (" + b.runtimeLabel() + ")",
		IsolationLevels: b.isolationLevels(),
		Notes: []string{
			quotaNote(b),
			"per-process memory_mb of managed processes is not enforced; the session's memory limit applies",
			processNote(b),
			"a container's mounts are fixed at creation: naming a skill the session does not have yet recreates it (its /workspace volume starts empty unless host_path is set)",
		},
	}
	if b.isGVisor(b.runtime) || b.gvisorRuntime != "" {
		d.Notes = append(d.Notes, "gVisor sessions: memory and pids limits apply to the sandbox as a whole (its kernel's threads count, pids_limit is scaled); "+
			"hitting them ends the whole sandbox and the next call starts it again (files kept, processes gone)")
		if b.agentOff == "" && b.agentBinary != "" {
			d.Notes = append(d.Notes, "gVisor sessions served by the session agent (runsc registered with --host-uds=open): a terminal command runs on a terminal "+
				"the agent makes inside the sandbox (runsc does not take a host terminal), so its output passes through the agent; boxrt reads it from a pipe and bounds it as any output")
		}
	}
	if b.agentOff != "" {
		d.Notes = append(d.Notes, "commands run through Engine execs, not the session agent: "+b.agentOff)
	} else if off := b.gvisorAgentNote(); off != "" {
		d.Notes = append(d.Notes, "gVisor sessions run commands through Engine execs, not the session agent: "+off+
			"; runsc applies the seccomp profile to the container's init only, so those commands are not under it (a root docker.user can leave setuid files in host directories)")
	}
	if b.cpuLimit {
		d.EnforcedLimits = append(d.EnforcedLimits, "cpus")
	} else {
		d.Notes = append(d.Notes, "cpu limit disabled (docker cpu_limit_enabled=false)")
	}
	return d
}

func processNote(b *Backend) string {
	if b.processUser == "" {
		return "managed processes run as the same user as execs: an exec can read their environment (docker.process_user separates them)"
	}
	if b.isGVisor(b.runtime) {
		return "managed processes run as " + b.processUser + ", but gVisor (runsc 20221219 measured) lets any user read /proc/<pid>/environ: execs can still read their environment"
	}
	return "managed processes run as " + b.processUser + ": execs cannot read their environment"
}

func quotaNote(b *Backend) string {
	if !b.localEngine() || b.stateDir == "" {
		return "workspace_quota_mb is not enforced: the engine is not on this host"
	}
	if b.defaultQuotaMB == 0 {
		return "workspace_quota_mb bounds the session's own workspace (ext4 image); 0 leaves it unbounded; host_path workspaces are never bounded"
	}
	return fmt.Sprintf("workspace_quota_mb bounds the session's own workspace (ext4 image); 0 means the default of %d MB; host_path workspaces are never bounded", b.defaultQuotaMB)
}

// Probe implements backends.Backend: a Ping bounded by a short timeout.
func (b *Backend) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	ping, err := b.cli.Ping(ctx)
	if err != nil {
		return b.unavailable(err)
	}
	if ping.APIVersion != "" && versions.LessThan(ping.APIVersion, minAPIVersion) {
		return boxerr.BackendUnavailable("Docker engine at %s speaks API %s; boxrt needs at least %s (upgrade docker.io)",
			b.cli.DaemonHost(), ping.APIVersion, minAPIVersion)
	}
	return b.checkRuntimes(ctx)
}

func (b *Backend) unavailable(err error) *boxerr.Error {
	return boxerr.BackendUnavailable("Docker engine not reachable at %s: %v. To fix: install Docker (apt-get install docker.io), "+
		"start the daemon (systemctl start docker, or run dockerd), make sure this user may use the socket "+
		"(root or the docker group), or set DOCKER_HOST to a running engine",
		b.cli.DaemonHost(), err).Wrap(err)
}

// apiError turns an Engine API failure into a typed error: a connection
// failure means the backend is gone, anything else is a BoxError naming what
// was being done. The cause stays reachable for errors.Is (context errors in
// particular).
func (b *Backend) apiError(what string, err error) *boxerr.Error {
	if client.IsErrConnectionFailed(err) {
		return b.unavailable(err)
	}
	return boxerr.Failure("docker backend error: %s: %v", what, err).Wrap(err)
}

// sessionError is apiError for calls on a session's container: a missing
// container means the session is gone.
func (b *Backend) sessionError(info backends.Session, what string, err error) *boxerr.Error {
	if cerrdefs.IsNotFound(err) {
		return boxerr.SessionNotFound(info.SessionID).Wrap(err)
	}
	return b.apiError(what, err)
}

func randomHex(n int) string {
	buf := make([]byte, n/2)
	if _, err := rand.Read(buf); err != nil {
		// crypto/rand does not fail on Linux; a constant would risk name clashes.
		panic(err)
	}
	return hex.EncodeToString(buf)
}

// envList renders env in a stable order so identical requests produce
// identical exec configs.
func envList(env map[string]string) []string {
	if len(env) == 0 {
		return nil
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// cleanupContext is for work that must happen even when the caller's
// context is already done (removing a half-created container, killing a
// timed-out command).
func cleanupContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
