package kube

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Name is the backend's wire name.
const Name = "kube"

// DefaultImage is the image a session gets when neither the spec nor the
// Config names one.
const DefaultImage = "boxrt-sandbox:latest"

// Defaults of the Config fields.
const (
	DefaultTmpSizeMB       = 64
	DefaultRunAsUser       = 1000
	DefaultWorkspaceSizeMB = 1024
	DefaultStartTimeout    = 2 * time.Minute
	DefaultRequestPercent  = 10
)

const probeTimeout = 10 * time.Second

// Config configures the kube backend.
type Config struct {
	// InstanceID is the stable id of this boxrt installation. Replicas that
	// share it serve each other's sessions; Adopt never looks at Pods of
	// another instance id.
	InstanceID string
	// Kubeconfig is a kubeconfig file; "" means the in-cluster config, then
	// $KUBECONFIG (and ~/.kube/config), as kubectl does.
	Kubeconfig string
	// Namespace holds the sessions' Pods; "" means the kubeconfig context's
	// namespace (in-cluster: the Pod's own), else "default".
	Namespace string
	// Image is used when a spec names none; default "boxrt-sandbox:latest".
	Image string
	// ImagePullPolicy is "", "IfNotPresent", "Always" or "Never".
	ImagePullPolicy string
	// RuntimeClass names a RuntimeClass (e.g. gVisor's "gvisor"); "" uses
	// the cluster's default runtime.
	RuntimeClass string
	// StorageClass is the class of the PersistentVolumeClaim a persistent
	// session's workspace gets; "" uses the cluster's default class.
	StorageClass string
	// WorkspaceSizeMB is the size requested for a persistent session's PVC
	// when its spec sets no workspace_quota_mb; default 1024.
	WorkspaceSizeMB int
	// NodeSelector and Tolerations are copied onto every session Pod.
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	// RunAsUser and RunAsGroup are the non-root uid/gid the sandbox runs as
	// (default 1000:1000); 0 is refused, the Pods run with runAsNonRoot.
	RunAsUser  int64
	RunAsGroup int64
	// TmpSizeMB bounds a session's /tmp (its own claim for a persistent
	// session, an emptyDir on the node's disk otherwise); default 64.
	TmpSizeMB int
	// RequestPercent is the share of a session's CPU and memory limits it
	// requests from the scheduler (1..100, default 10): requests equal to
	// the limits would let a small node hold only a couple of sessions.
	RequestPercent int
	// HostPathClaims maps a host path a spec may name (host_path or an
	// extra mount) to an existing PersistentVolumeClaim in the namespace
	// that holds the same data; unmapped host paths are refused.
	HostPathClaims map[string]string
	// StartTimeout bounds how long a new Pod may take to run; default 2 min.
	StartTimeout time.Duration
	// AgentBinary is a static boxrt binary, uploaded into each Pod to run
	// as its session agent (agent.go); "" runs every command as its own
	// exec.
	AgentBinary string
}

// Backend runs sessions as Pods. It is safe for concurrent use.
type Backend struct {
	cfg        Config
	rc         *rest.Config
	api        apiClients
	ns         string
	instance   string
	instanceL  string   // the instance id as a label value (hashed)
	configErr  error    // a kubeconfig that could not be loaded; every call reports it
	configFrom string   // where the client config came from, for messages
	touched    sync.Map // Pod name → when its last-used annotation was written
	// legacy holds the adopted Pods an earlier boxrt made without the
	// pidDir volume (Pod name → true): their pid files go to /tmp.
	legacy sync.Map
	// agents: Pod name → *podAgent; noAgent: adopted Pods made without
	// the agent's volume (Pod name → true).
	agents, noAgent sync.Map

	fileSystem // the file API (files.go)
}

var _ backends.Backend = (*Backend)(nil)

// New builds a backend from cfg. It does no API call: an unreachable API
// server or missing permissions show up in Probe. A kubeconfig that cannot
// be loaded is not an error here either (boxrt must still start with
// another backend); every call then fails with BoxBackendUnavailableError.
func New(cfg Config) (*Backend, error) {
	if strings.TrimSpace(cfg.InstanceID) == "" {
		return nil, boxerr.Validation("instance_id", "kube backend: instance id must not be empty")
	}
	if err := validate(&cfg); err != nil {
		return nil, err
	}
	b := &Backend{cfg: cfg, instance: cfg.InstanceID, instanceL: InstanceLabel(cfg.InstanceID), ns: cfg.Namespace}
	b.fileSystem = newFileSystem(b)
	if b.ns == "" {
		b.ns = "default" // until the configuration says otherwise
	}
	rc, ns, from, err := loadConfig(cfg.Kubeconfig)
	b.configFrom = from
	if err != nil {
		b.configErr = boxerr.BackendUnavailable("kube backend: cannot load the cluster configuration (%s): %v", from, err).Wrap(err)
		return b, nil
	}
	if cfg.Namespace != "" {
		ns = cfg.Namespace
	}
	// The defaults (5 QPS, burst 10) would throttle a replica serving a
	// few dozen sessions, each exec being one request.
	rc.QPS, rc.Burst = 50, 100
	api, err := newAPIClients(rc)
	if err != nil {
		b.configErr = boxerr.BackendUnavailable("kube backend: invalid client configuration (%s): %v", from, err).Wrap(err)
		return b, nil
	}
	b.rc, b.api, b.ns = rc, api, ns
	return b, nil
}

func validate(cfg *Config) error {
	if cfg.Image = strings.TrimSpace(cfg.Image); cfg.Image == "" {
		cfg.Image = DefaultImage
	}
	switch corev1.PullPolicy(cfg.ImagePullPolicy) {
	case "", corev1.PullIfNotPresent, corev1.PullAlways, corev1.PullNever:
	default:
		return boxerr.Validation("kube.image_pull_policy", "kube.image_pull_policy must be IfNotPresent, Always or Never, got %q", cfg.ImagePullPolicy)
	}
	if cfg.RunAsUser == 0 {
		cfg.RunAsUser = DefaultRunAsUser
	}
	if cfg.RunAsGroup == 0 {
		cfg.RunAsGroup = cfg.RunAsUser
	}
	if cfg.RunAsUser < 0 || cfg.RunAsGroup < 0 {
		return boxerr.Validation("kube.run_as_user", "kube.run_as_user and run_as_group must be positive (sessions never run as root)")
	}
	if cfg.TmpSizeMB == 0 {
		cfg.TmpSizeMB = DefaultTmpSizeMB
	}
	if cfg.TmpSizeMB < 1 || cfg.TmpSizeMB > 16<<10 {
		return boxerr.Validation("kube.tmp_size_mb", "kube.tmp_size_mb must be between 1 and %d, got %d", 16<<10, cfg.TmpSizeMB)
	}
	if cfg.WorkspaceSizeMB == 0 {
		cfg.WorkspaceSizeMB = DefaultWorkspaceSizeMB
	}
	if cfg.WorkspaceSizeMB < 1 || cfg.WorkspaceSizeMB > backends.MaxWorkspaceQuotaMB {
		return boxerr.Validation("kube.workspace_size_mb", "kube.workspace_size_mb must be between 1 and %d, got %d", backends.MaxWorkspaceQuotaMB, cfg.WorkspaceSizeMB)
	}
	if cfg.RequestPercent == 0 {
		cfg.RequestPercent = DefaultRequestPercent
	}
	if cfg.RequestPercent < 1 || cfg.RequestPercent > 100 {
		return boxerr.Validation("kube.request_percent", "kube.request_percent must be between 1 and 100, got %d", cfg.RequestPercent)
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.StartTimeout < 0 {
		return boxerr.Validation("kube.start_timeout", "kube.start_timeout must be positive")
	}
	return nil
}

// loadConfig resolves the client configuration: an explicit kubeconfig,
// else the in-cluster service account, else $KUBECONFIG / ~/.kube/config.
// It returns the namespace the configuration names and a description of
// the source for messages.
func loadConfig(path string) (*rest.Config, string, string, error) {
	if path == "" {
		if rc, err := rest.InClusterConfig(); err == nil {
			ns := "default"
			if raw, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(raw) > 0 {
				ns = strings.TrimSpace(string(raw))
			}
			return rc, ns, "in-cluster service account", nil
		} else if !errors.Is(err, rest.ErrNotInCluster) {
			return nil, "", "in-cluster service account", err
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	from := "$KUBECONFIG or ~/.kube/config"
	if path != "" {
		rules.ExplicitPath = path
		from = "kubeconfig " + path
	} else if env := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); env != "" {
		from = "KUBECONFIG=" + env
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", from, err
	}
	ns, _, err := cc.Namespace()
	if err != nil || ns == "" {
		ns = "default"
	}
	return rc, ns, from, nil
}

// InstanceID is the instance id the backend's Pods are labelled with.
func (b *Backend) InstanceID() string { return b.instance }

// Namespace is the namespace the sessions' Pods live in.
func (b *Backend) Namespace() string { return b.ns }

// Name implements backends.Backend.
func (b *Backend) Name() string { return Name }

// DefaultImage implements backends.Backend.
func (b *Backend) DefaultImage() string { return b.cfg.Image }

// Describe implements backends.Backend.
func (b *Backend) Describe() backends.Description {
	iso := "Kubernetes Pod"
	if b.cfg.RuntimeClass != "" {
		iso += " (RuntimeClass " + b.cfg.RuntimeClass + ")"
	}
	return backends.Description{
		EnforcedLimits: []string{"memory", "cpus"},
		Isolation:      iso,
		Notes: append([]string{b.agentNote()},
			"pids_limit is not enforced per session: the node's kubelet podPidsLimit applies",
			"network off is a NetworkPolicy denying all traffic; only a CNI that enforces NetworkPolicy makes it a barrier",
			"workspace: emptyDir (sized by workspace_quota_mb, enforced by eviction) or, for persistent sessions, a PersistentVolumeClaim",
			"host_path is refused unless kube.host_path_claims maps it to a PersistentVolumeClaim",
			"a managed process lives as long as its exec stream to the API server: if that connection drops, the process gets EOF on stdin and is killed",
			"suspend deletes the Pod and keeps its PersistentVolumeClaims, the workspace's and /tmp's (persistent sessions only; root filesystem changes are lost); resume recreates the Pod on them",
			"snapshots and forks carry the workspace only (tar through an exec)",
			"warm pools serve non-persistent sessions only (a pooled Pod's workspace is an emptyDir); a claimed Pod keeps its pool name, found through an index ConfigMap of the session's name",
		),
	}
}

// Probe implements backends.Backend: the API server answers and boxrt's
// identity holds every permission it needs in the namespace.
func (b *Backend) Probe(ctx context.Context) error {
	if b.configErr != nil {
		return b.configErr
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if _, err := b.ServerVersion(ctx); err != nil {
		return err
	}
	missing, err := b.MissingPermissions(ctx)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return boxerr.BackendUnavailable("kube backend: missing RBAC permission in namespace %s: %s (see `boxrt doctor` for the Role boxrt needs)",
			b.ns, strings.Join(missing, ", ")).With("missing_permissions", missing)
	}
	return nil
}

// ServerVersion asks the API server for its version: the reachability
// check.
func (b *Backend) ServerVersion(ctx context.Context) (string, error) {
	if b.configErr != nil {
		return "", b.configErr
	}
	raw, err := b.api.core.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return "", boxerr.BackendUnavailable("kube backend: API server %s (%s) not reachable: %v", b.rc.Host, b.configFrom, err).Wrap(err)
	}
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	_ = json.Unmarshal(raw, &v)
	return v.GitVersion, nil
}

// apiError turns an API failure into a typed error: unreachable or
// forbidden means the backend is unusable; anything else is a failure.
func (b *Backend) apiError(what string, err error) *boxerr.Error {
	var be *boxerr.Error
	if errors.As(err, &be) {
		return be
	}
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return boxerr.BackendUnavailable("kube backend: %s: %v", what, err).Wrap(err)
	case isConnError(err):
		return boxerr.BackendUnavailable("kube backend: %s: API server not reachable: %v", what, err).Wrap(err)
	}
	return boxerr.Failure("kube backend error: %s: %v", what, err).Wrap(err)
}

func isConnError(err error) bool {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return false
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// quantityMB is n MiB as a resource quantity.
func quantityMB(n int) resource.Quantity {
	return *resource.NewQuantity(int64(n)<<20, resource.BinarySI)
}

// cleanupContext detaches bookkeeping calls from a caller that may already
// be gone, bounded by d.
func cleanupContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
