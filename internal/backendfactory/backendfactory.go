package backendfactory

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/bwrap"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/backends/e2b"
	"github.com/boxrt/boxrt/backends/host"
	"github.com/boxrt/boxrt/backends/kube"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

// New makes the backend called name: the runtime's factory, and the
// doctor's.
func New(name string, cfg runtime.Config, instanceID, stateDir string) (backends.Backend, error) {
	switch name {
	case "docker":
		// Without an agent binary commands use Engine execs.
		agent, _ := AgentBinary()
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
			AgentBinary:             agent,
			Egress:                  cfg.EgressProxy(),
		})
	case "bwrap":
		agent, err := AgentBinary()
		if err != nil {
			return nil, fmt.Errorf("bwrap: cannot find boxrt's own binary for the session agent: %w", err)
		}
		return bwrap.New(bwrap.Config{InstanceID: instanceID, StateDir: filepath.Clean(stateDir), AgentBinary: agent,
			IdleRelease: time.Duration(cfg.Bwrap.IdleReleaseSec) * time.Second, Egress: cfg.EgressProxy()})
	case "kube":
		kc := KubeConfig(cfg.Kube, instanceID)
		// Without an agent binary every command is an exec of its own.
		kc.AgentBinary, _ = AgentBinary()
		return kube.New(kc)
	case host.Name:
		return host.New(host.Config{InstanceID: instanceID, StateDir: filepath.Clean(stateDir)})
	case e2b.Name:
		c, err := E2BConfig(cfg, instanceID)
		if err != nil {
			return nil, err
		}
		return e2b.New(c)
	}
	return nil, fmt.Errorf("unknown backend %q", name)
}

// AgentBinary is the program bound into sessions as their agent (`boxrt
// agent`): boxrt itself, whose release build is static (CGO_ENABLED=0) and
// so runs in any image, unless BOXRT_AGENT_BINARY names another build — a
// static one beside a boxrt built with cgo, as the race-enabled test build
// is.
func AgentBinary() (string, error) {
	if p := os.Getenv("BOXRT_AGENT_BINARY"); p != "" {
		return p, nil
	}
	return os.Executable()
}

// KubeConfig maps the kube config section onto the backend's Config; the
// section's instance, when set, replaces this installation's instance id so
// replicas can share sessions.
func KubeConfig(k runtime.Kube, instanceID string) kube.Config {
	if k.Instance != "" {
		instanceID = k.Instance
	}
	tol := make([]corev1.Toleration, len(k.Tolerations))
	for i, t := range k.Tolerations {
		tol[i] = corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOperator(t.Operator), Value: t.Value,
			Effect: corev1.TaintEffect(t.Effect), TolerationSeconds: t.TolerationSeconds}
	}
	return kube.Config{
		InstanceID:      instanceID,
		Kubeconfig:      k.Kubeconfig,
		Namespace:       k.Namespace,
		Image:           k.Image,
		ImagePullPolicy: k.ImagePullPolicy,
		RuntimeClass:    k.RuntimeClass,
		StorageClass:    k.StorageClass,
		WorkspaceSizeMB: k.WorkspaceSizeMB,
		NodeSelector:    k.NodeSelector,
		Tolerations:     tol,
		RunAsUser:       k.RunAsUser,
		RunAsGroup:      k.RunAsGroup,
		TmpSizeMB:       k.TmpSizeMB,
		RequestPercent:  k.RequestPercent,
		HostPathClaims:  k.HostPathClaims,
		StartTimeout:    time.Duration(k.StartTimeoutSec) * time.Second,
	}
}

// E2BConfig maps the e2b config section (LangBot's keys api_key,
// api_url, template, plus sandbox_url and domain) onto the backend's
// Config. The key falls back to E2B_API_KEY as E2B's SDKs do; the
// session TTL sets how long a sandbox outlives its last use.
func E2BConfig(cfg runtime.Config, instanceID string) (e2b.Config, error) {
	c := e2b.Config{InstanceID: instanceID, SessionTTL: time.Duration(cfg.Limits.SessionTTLSec) * time.Second}
	for key, dst := range map[string]*string{"api_key": &c.APIKey, "api_url": &c.APIURL, "sandbox_url": &c.SandboxURL,
		"domain": &c.Domain, "template": &c.Template} {
		v, ok := cfg.E2B[key]
		if !ok || v == nil {
			continue
		}
		s, isString := v.(string)
		if !isString {
			return c, boxerr.Validation("e2b."+key, "e2b.%s must be a string, got %T", key, v)
		}
		*dst = strings.TrimSpace(s)
	}
	if c.APIKey == "" {
		c.APIKey = os.Getenv("E2B_API_KEY")
	}
	return c, nil
}

// The real backends report measured isolation (box_get_backend_info).
var (
	_ runtime.IsolationProber = (*docker.Backend)(nil)
	_ runtime.IsolationProber = (*bwrap.Backend)(nil)
	// The e2b backend serves the file API through envd.
	_ runtime.FileSystem = (*e2b.Backend)(nil)
)
