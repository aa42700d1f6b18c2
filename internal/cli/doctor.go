package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/e2b"
	"github.com/boxrt/boxrt/backends/kube"
	"github.com/boxrt/boxrt/internal/backendfactory"
	"github.com/boxrt/boxrt/reconnect"
	"github.com/boxrt/boxrt/runtime"
	"github.com/docker/docker/client"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check every backend and say what works, what is missing and how to fix it",
		Description: `Probes the Docker engine (socket, permissions, version, cgroups, images)
and bubblewrap (binary, a real sandbox run, which limits cgroups can
enforce), checks the state directory, and says which backend "auto" would
pick. Then it measures the isolation of every usable backend and engine
runtime (runc, runsc, …) by running a probe in a real sandbox: kernel
shared or not, seccomp, user namespace, capabilities, read-only root,
network, cgroup limits. Exit status 0 when at least one backend works, 1 otherwise.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "configuration file (JSON or YAML), as for serve"},
			&cli.StringFlag{Name: "state-dir", Value: reconnect.DefaultStateDir(), Usage: "state directory, as for serve"},
			&cli.BoolFlag{Name: "json", Usage: "print the checks as JSON"},
		},
		Action: noArgs("doctor", runDoctor),
	}
}

// check is one line of the doctor's report.
type check struct {
	Backend string `json:"backend,omitempty"`
	Status  string `json:"status"` // ok, warn, fail
	What    string `json:"what"`
	Fix     string `json:"fix,omitempty"`
}

type doctorReport struct {
	Version string   `json:"version"`
	Checks  []check  `json:"checks"`
	Usable  []string `json:"usable_backends"`
	Auto    string   `json:"auto_selects"`
	// KubeRole is the minimal Role (and RoleBinding) the kube backend
	// needs, when kube is configured.
	KubeRole string `json:"kube_role,omitempty"`
	// Isolation is measured per usable backend and engine runtime.
	Isolation []isolationEntry `json:"isolation"`
}

func runDoctor(c *cli.Context) error {
	cfg, err := loadConfig(c.String("config"), c.String("state-dir"))
	if err != nil {
		return err
	}
	// Room for a probe sandbox per backend and runtime (gVisor's take
	// seconds each on a busy machine).
	ctx, cancel := context.WithTimeout(c.Context, 4*time.Minute)
	defer cancel()
	rep := doctorReport{Version: c.App.Version}
	add := func(ch check) { rep.Checks = append(rep.Checks, ch) }

	stateDir := c.String("state-dir")
	if err := os.MkdirAll(stateDir, 0o700); err != nil || unix.Access(stateDir, unix.W_OK) != nil {
		add(check{Status: "fail", What: fmt.Sprintf("state dir %s is not writable", stateDir), Fix: "pass --state-dir DIR or set BOXRT_STATE_DIR to a writable directory"})
	} else {
		add(check{Status: "ok", What: fmt.Sprintf("state dir %s is writable", stateDir)})
	}

	names := runtime.BackendOrder
	if cfg.Backend == "kube" || cfg.Backend == "e2b" {
		// kube and e2b are never auto-selected, so they are checked only
		// when the configuration names them.
		names = append(slices.Clone(names), cfg.Backend)
	}
	for _, name := range names {
		var checks []check
		switch name {
		case "docker":
			checks = doctorDocker(ctx, cfg)
		case "bwrap":
			checks = doctorBwrap(ctx, cfg, stateDir)
		case "kube":
			checks, rep.KubeRole = doctorKube(ctx, cfg)
		case "e2b":
			checks = doctorE2B(ctx, cfg)
		}
		usable := true
		for _, ch := range checks {
			ch.Backend = name
			add(ch)
			if ch.Status == "fail" {
				usable = false
			}
		}
		if usable {
			rep.Usable = append(rep.Usable, name)
		}
	}
	for _, name := range runtime.Candidates(cfg.Backend) {
		if contains(rep.Usable, name) {
			rep.Auto = name
			break
		}
	}

	rep.Isolation = doctorIsolation(ctx, cfg, rep.Usable)

	out := c.App.Writer
	if c.Bool("json") {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		printDoctor(out, rep, cfg.Backend)
		printIsolation(out, rep.Isolation)
	}
	if len(rep.Usable) == 0 {
		return &exitError{code: 1}
	}
	return nil
}

func printDoctor(w io.Writer, rep doctorReport, choice string) {
	fmt.Fprintf(w, "boxrt doctor (version %s)\n\n", rep.Version)
	for _, ch := range rep.Checks {
		prefix := ""
		if ch.Backend != "" {
			prefix = ch.Backend + ": "
		}
		fmt.Fprintf(w, "[%-4s] %s%s\n", ch.Status, prefix, ch.What)
		if ch.Fix != "" {
			fmt.Fprintf(w, "       fix: %s\n", ch.Fix)
		}
	}
	fmt.Fprintln(w)
	if rep.KubeRole != "" {
		fmt.Fprintf(w, "the minimal Role the kube backend needs (kubectl apply -f -):\n\n%s\n", rep.KubeRole)
	}
	if rep.Auto == "" {
		fmt.Fprintf(w, "no usable backend for backend=%q: boxrt would answer BoxBackendUnavailableError\n", orAuto(choice))
		return
	}
	fmt.Fprintf(w, "backend=%q selects: %s\n", orAuto(choice), rep.Auto)
}

func orAuto(s string) string {
	if s == "" {
		return "auto"
	}
	return s
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func doctorDocker(ctx context.Context, cfg runtime.Config) []check {
	var out []check
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = client.DefaultDockerHost
	}
	if sock, ok := strings.CutPrefix(host, "unix://"); ok {
		switch _, err := os.Stat(sock); {
		case err != nil:
			return append(out, check{Status: "fail", What: fmt.Sprintf("no engine socket at %s", sock),
				Fix: "apt-get install docker.io, then start the engine (systemctl start docker, or dockerd &); or set DOCKER_HOST (Podman: unix:///run/podman/podman.sock)"})
		case unix.Access(sock, unix.R_OK|unix.W_OK) != nil:
			return append(out, check{Status: "fail", What: fmt.Sprintf("no permission on %s", sock),
				Fix: "run boxrt as root or add its user to the docker group (usermod -aG docker USER)"})
		}
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return append(out, check{Status: "fail", What: fmt.Sprintf("bad DOCKER_HOST %q: %v", host, err), Fix: "fix DOCKER_HOST"})
	}
	defer cli.Close()
	b, err := backendfactory.New("docker", cfg, "doctor", os.TempDir())
	if err == nil {
		err = b.Probe(ctx)
		runtime.CloseBackend(b)
	}
	if err != nil {
		return append(out, check{Status: "fail", What: fmt.Sprintf("engine at %s does not answer: %v", host, err),
			Fix: "start dockerd (systemctl start docker, or dockerd &) and check DOCKER_HOST"})
	}
	info, err := cli.Info(ctx)
	if err != nil {
		return append(out, check{Status: "fail", What: fmt.Sprintf("engine info failed: %v", err)})
	}
	out = append(out, check{Status: "ok", What: fmt.Sprintf("engine %s answers at %s (cgroup v%s, %s driver, %s storage)",
		info.ServerVersion, host, info.CgroupVersion, info.CgroupDriver, info.Driver)})
	out = append(out, dockerIsolationChecks(info.SecurityOptions)...)
	if !info.MemoryLimit || !info.PidsLimit {
		out = append(out, check{Status: "warn", What: "the engine cannot enforce memory or pids limits on this kernel",
			Fix: "enable the memory and pids cgroup controllers"})
	}
	img := cfg.Docker.Image
	if _, err := cli.ImageInspect(ctx, img); err != nil {
		return append(out, check{Status: "warn", What: fmt.Sprintf("default image %s is missing; sessions without an image will fail", img),
			Fix: "scripts/build-image (builds it from a debootstrap rootfs), or docker load / docker import one and set docker.image"})
	}
	return append(out, check{Status: "ok", What: fmt.Sprintf("default image %s is present", img)})
}

// dockerIsolationChecks reports the engine-wide isolation settings boxrt
// cannot set per container: user namespace remapping and seccomp.
func dockerIsolationChecks(securityOptions []string) []check {
	var userns, seccomp bool
	profile := ""
	for _, opt := range securityOptions {
		for _, kv := range strings.Split(opt, ",") {
			switch k, v, _ := strings.Cut(kv, "="); {
			case k == "name" && v == "userns":
				userns = true
			case k == "name" && v == "seccomp":
				seccomp = true
			case k == "profile" && seccomp && profile == "":
				profile = v
			}
		}
	}
	var out []check
	if userns {
		out = append(out, check{Status: "ok", What: "dockerd runs with userns-remap: root in a container is an unprivileged user on the host"})
	} else {
		out = append(out, check{Status: "warn", What: "dockerd runs without userns-remap: a sandbox user is the same uid on the host (uid 0 is host root, without capabilities)",
			Fix: `set "userns-remap": "default" in /etc/docker/daemon.json and restart dockerd (existing images and containers are not visible to the remapped engine)`})
	}
	switch {
	case !seccomp:
		out = append(out, check{Status: "warn", What: "dockerd applies no seccomp profile", Fix: "use a kernel and dockerd built with seccomp"})
	case profile == "unconfined":
		out = append(out, check{Status: "warn", What: "dockerd's seccomp profile is unconfined", Fix: "remove seccomp-profile=unconfined from the dockerd configuration"})
	default:
		out = append(out, check{Status: "ok", What: fmt.Sprintf("dockerd applies the %s seccomp profile", orDefault(profile))})
	}
	return out
}

func orDefault(s string) string {
	if s == "" {
		return "default"
	}
	return s
}

func doctorBwrap(ctx context.Context, cfg runtime.Config, stateDir string) []check {
	path, err := exec.LookPath("bwrap")
	if err != nil {
		return []check{{Status: "fail", What: "bubblewrap is not installed", Fix: "apt-get install bubblewrap"}}
	}
	version, _ := exec.CommandContext(ctx, path, "--version").Output()
	dir, err := os.MkdirTemp("", "boxrt-doctor-")
	if err != nil {
		return []check{{Status: "fail", What: err.Error()}}
	}
	defer os.RemoveAll(dir)
	b, err := backendfactory.New("bwrap", cfg, "doctor", filepath.Join(dir, "state"))
	if err == nil {
		err = b.Probe(ctx)
		defer runtime.CloseBackend(b)
	}
	if err != nil {
		return []check{{Status: "fail", What: fmt.Sprintf("%s cannot run a sandbox: %v", strings.TrimSpace(string(version)), err),
			Fix: "run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"}}
	}
	desc := b.Describe()
	out := []check{{Status: "ok", What: fmt.Sprintf("%s at %s runs sandboxes", strings.TrimSpace(string(version)), path)}}
	missing := missingLimits(desc)
	if len(missing) == 0 {
		out = append(out, check{Status: "ok", What: "cgroups enforce memory, pids and cpus limits"})
	} else {
		out = append(out, check{Status: "warn", What: fmt.Sprintf("limits not enforced here: %s", strings.Join(missing, ", ")),
			Fix: "run boxrt as root with cgroup v2 (or v1 memory/pids/cpu controllers) mounted and delegated"})
	}
	return out
}

func missingLimits(d backends.Description) []string {
	var missing []string
	for _, l := range []string{"memory", "pids", "cpus"} {
		if !contains(d.EnforcedLimits, l) {
			missing = append(missing, l)
		}
	}
	return missing
}

// doctorKube checks the API server and boxrt's RBAC permissions in the
// configured namespace (SelfSubjectAccessReview), and returns the minimal
// Role for that namespace.
func doctorKube(ctx context.Context, cfg runtime.Config) ([]check, string) {
	kb, err := kube.New(backendfactory.KubeConfig(cfg.Kube, "doctor"))
	if err != nil {
		return []check{{Status: "fail", What: err.Error(), Fix: "fix the kube section of the configuration"}}, ""
	}
	role := kube.MinimalRole(kb.Namespace(), "boxrt")
	version, err := kb.ServerVersion(ctx)
	if err != nil {
		return []check{{Status: "fail", What: err.Error(),
			Fix: "set kube.kubeconfig (or $KUBECONFIG) to a kubeconfig whose API server answers, or run boxrt in the cluster"}}, role
	}
	out := []check{{Status: "ok", What: fmt.Sprintf("API server %s answers; sessions go to namespace %s", version, kb.Namespace())}}
	missing, err := kb.MissingPermissions(ctx)
	switch {
	case err != nil:
		out = append(out, check{Status: "fail", What: err.Error()})
	case len(missing) > 0:
		out = append(out, check{Status: "fail", What: "missing RBAC permissions in namespace " + kb.Namespace() + ": " + strings.Join(missing, ", "),
			Fix: "bind boxrt's identity to the Role printed below"})
	default:
		out = append(out, check{Status: "ok", What: "RBAC allows everything boxrt does in namespace " + kb.Namespace() + " (pods, pods/exec, persistentvolumeclaims, networkpolicies)"})
	}
	return out, role
}

// doctorE2B checks that the configured E2B-compatible endpoint answers a
// listing with the configured key.
func doctorE2B(ctx context.Context, cfg runtime.Config) []check {
	c, err := backendfactory.E2BConfig(cfg, "doctor")
	if err != nil {
		return []check{{Status: "fail", What: err.Error(), Fix: "fix the e2b section of the configuration"}}
	}
	b, err := e2b.New(c)
	if err != nil {
		return []check{{Status: "fail", What: err.Error(), Fix: "set e2b.api_key (or $E2B_API_KEY) and e2b.api_url"}}
	}
	defer b.Close()
	if err := b.Probe(ctx); err != nil {
		return []check{{Status: "fail", What: "the E2B control API does not answer a listing: " + err.Error(),
			Fix: "check e2b.api_url (for a boxrt endpoint: http://HOST:PORT/e2b) and that e2b.api_key is a key it accepts"}}
	}
	return []check{{Status: "ok", What: fmt.Sprintf("the E2B control API answers with the configured key; sessions use template %q", b.DefaultImage())}}
}
