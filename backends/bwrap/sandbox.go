package bwrap

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

// HostImage is the image name meaning "the host's own system directories".
const HostImage = "host"

// defaultPath is the PATH a sandboxed command starts with.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// hostSystemDirs are bound read-only (or re-created as the same symlink on
// merged-/usr systems) when the image is the host.
var hostSystemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// hostEtcEntries are the /etc essentials a host-image sandbox sees: the
// dynamic loader's configuration, alternatives (Debian's symlink farm that
// /usr/bin entries point into), TLS roots, user and group names, name
// service switch, time zone and the static host table. Nothing else of the
// host's /etc (shadow, ssh keys, app secrets) is visible.
var hostEtcEntries = []string{
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
	"ssl", "ca-certificates", "ca-certificates.conf", "pki",
	"passwd", "group", "nsswitch.conf", "localtime", "hosts",
	"protocols", "services", "os-release",
}

// The sandbox's uid 0 is the host's root when boxrt runs as root, and the
// kernel lets global root write many /proc files on file mode alone,
// capabilities or not: /proc/sys (global sysctls such as
// vm.drop_caches!), /proc/sysrq-trigger. bwrap covers some of these only
// when it finds them writable, which its check misjudges for /proc/sys. So,
// like runc's defaults, these are made read-only and the information leaks
// masked.
var (
	procReadOnly = []string{"sys", "sysrq-trigger", "fs", "irq", "bus"}
	procMasked   = []string{"kcore", "keys", "timer_list", "timer_stats", "sched_debug", "latency_stats", "acpi", "scsi", "asound"}
)

// imageSkip are rootfs entries replaced by our own mounts.
var imageSkip = []string{"proc", "dev", "tmp", "home"}

type bind struct {
	src, dst string
	ro       bool
}

// layout is everything one bwrap invocation needs besides the command.
type layout struct {
	image   string // "" = host system directories, else a rootfs directory
	network bool
	userns  bool
	tmp     string // host dir bound at /tmp ("" = a fresh tmpfs)
	home    string // host dir bound at /home ("" = a fresh tmpfs)
	binds   []bind // workspace and extra mounts
	workdir string
	env     map[string]string
}

// resolveImage maps a spec image to a rootfs directory ("" for the host).
// full also checks for /bin/sh inside (done at session start; execs only
// re-check that the directory still exists).
func resolveImage(image string, full bool) (string, error) {
	image = strings.TrimSpace(image)
	if image == "" || image == HostImage {
		return "", nil
	}
	if !filepath.IsAbs(image) {
		return "", boxerr.Validation("image",
			"bwrap images are rootfs directories: image %q is neither %q nor an absolute path to a directory", image, HostImage)
	}
	dir := filepath.Clean(image)
	if dir == "/" {
		return "", boxerr.Validation("image",
			"image / would expose the whole host filesystem; use %q for the host's system directories", HostImage)
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return "", boxerr.Validation("image",
			"bwrap images are rootfs directories: %s is not a directory", dir)
	}
	if full {
		root, err := os.OpenRoot(dir)
		if err != nil {
			return "", boxerr.Validation("image", "rootfs directory %s cannot be opened: %v", dir, err).Wrap(err)
		}
		defer root.Close()
		if _, err := root.Stat("bin/sh"); err != nil {
			return "", boxerr.Validation("image", "rootfs directory %s has no /bin/sh (commands run through it)", dir)
		}
	}
	return dir, nil
}

// checkMountPath validates a sandbox-side mount point: absolute, not the
// root, not inside /proc or /dev (those are the kernel's, mounting over them
// would defeat --proc/--dev).
func checkMountPath(field, p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", boxerr.Validation(field, "%s must be absolute, got %q", field, p)
	}
	if strings.ContainsRune(p, 0) {
		return "", boxerr.Validation(field, "%s must not contain NUL bytes", field)
	}
	c := filepath.Clean(p)
	if c == "/" {
		return "", boxerr.Validation(field, "%s must not be /", field)
	}
	for _, r := range []string{"/proc", "/dev"} {
		if c == r || strings.HasPrefix(c, r+"/") {
			return "", boxerr.Validation(field, "%s must not be under %s, got %q", field, r, p)
		}
	}
	return c, nil
}

func checkEnv(field string, env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return boxerr.Validation(field, "env name %q is invalid", k)
		}
		if strings.ContainsRune(v, 0) {
			return boxerr.Validation(field, "env value of %s contains a NUL byte", k)
		}
	}
	return nil
}

// layoutFor builds the sandbox layout of a session from the SessionInfo the
// runtime passes in (so mounts may change between execs) and the session's
// state directory.
func (b *Backend) layoutFor(dir string, info backends.SessionInfo, workdir string, env map[string]string) (layout, error) {
	image, err := resolveImage(info.Image, false)
	if err != nil {
		return layout{}, err
	}
	mp := info.MountPath
	if mp == "" {
		mp = backends.DefaultMountPath
	}
	mountPath, err := checkMountPath("mount_path", mp)
	if err != nil {
		return layout{}, err
	}
	ws := bind{src: filepath.Join(dir, workspaceDir), dst: mountPath}
	if info.HostPath != "" && info.HostPathMode != backends.MountNone {
		if !filepath.IsAbs(info.HostPath) {
			return layout{}, boxerr.Validation("host_path", "host_path must be absolute, got %q", info.HostPath)
		}
		ws.src = filepath.Clean(info.HostPath)
		ws.ro = info.HostPathMode == backends.MountRO
	}
	binds := []bind{ws}
	for i, m := range info.ExtraMounts {
		if m.Mode == backends.MountNone {
			continue
		}
		field := fmt.Sprintf("extra_mounts[%d]", i)
		dst, err := checkMountPath(field+".mount_path", m.MountPath)
		if err != nil {
			return layout{}, err
		}
		if !filepath.IsAbs(m.HostPath) || strings.ContainsRune(m.HostPath, 0) {
			return layout{}, boxerr.Validation(field+".host_path", "%s.host_path must be absolute, got %q", field, m.HostPath)
		}
		binds = append(binds, bind{src: filepath.Clean(m.HostPath), dst: dst, ro: m.Mode == backends.MountRO})
	}
	// bwrap applies mounts in order, so a parent mounted after its child
	// would hide it: mount shallow paths first.
	sort.SliceStable(binds, func(i, j int) bool { return depth(binds[i].dst) < depth(binds[j].dst) })

	if workdir == "" {
		workdir = mountPath
	}
	if !filepath.IsAbs(workdir) || strings.ContainsRune(workdir, 0) {
		return layout{}, boxerr.Validation("workdir", "workdir must be absolute, got %q", workdir)
	}
	if err := checkEnv("env", env); err != nil {
		return layout{}, err
	}
	return layout{
		image:   image,
		network: info.Network == backends.NetworkOn,
		userns:  b.userns.Load(),
		tmp:     filepath.Join(dir, tmpDir),
		home:    filepath.Join(dir, homeDir),
		binds:   binds,
		workdir: filepath.Clean(workdir),
		env:     env,
	}, nil
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

// prepareWorkdir creates the working directory on the host when it lies in
// a writable directory we bind (the workspace above all), because bwrap's
// --chdir needs it to exist. The deepest matching mount wins, as it does
// inside the sandbox. Errors are ignored: bwrap then reports the failed
// chdir itself.
func prepareWorkdir(l layout) {
	// Mount order is tmp, home, then binds (shallow first), so among equally
	// deep matches the later one is what the sandbox sees.
	mounts := []bind{}
	if l.tmp != "" {
		mounts = append(mounts, bind{src: l.tmp, dst: "/tmp"})
	}
	if l.home != "" {
		mounts = append(mounts, bind{src: l.home, dst: "/home"})
	}
	mounts = append(mounts, l.binds...)
	var best *bind
	for i := range mounts {
		m := &mounts[i]
		under := l.workdir == m.dst || strings.HasPrefix(l.workdir, m.dst+"/")
		if under && (best == nil || depth(m.dst) >= depth(best.dst)) {
			best = m
		}
	}
	if best == nil || best.ro {
		return
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(l.workdir, best.dst), "/")
	_ = mkdirUnder(best.src, rel)
}

// bwrapArgs turns a layout into bwrap options (everything before the
// command). They travel through --args on a memfd, never on bwrap's command
// line, so env values (API keys…) are not visible in the host's process
// list.
func bwrapArgs(l layout) ([]string, error) {
	a := []string{"--unshare-all"}
	if l.userns {
		// A user namespace of our own lets --disable-userns forbid nested
		// ones, closing a large kernel attack surface to the command.
		a = append(a, "--unshare-user", "--disable-userns")
	}
	if l.network {
		a = append(a, "--share-net")
	}
	a = append(a,
		"--die-with-parent", // bwrap's death (our kill) takes the namespace down
		"--new-session",     // no controlling terminal: no TIOCSTI injection
		"--cap-drop", "ALL", // root in the sandbox keeps no capabilities
		"--hostname", "boxrt",
	)
	var err error
	if l.image == "" {
		a = hostRoot(a, l.network)
	} else if a, err = imageRoot(a, l.image, l.network); err != nil {
		return nil, err
	}
	a = append(a, "--proc", "/proc")
	a = procHardening(a)
	a = append(a, "--dev", "/dev")
	if l.tmp != "" {
		a = append(a, "--bind", l.tmp, "/tmp")
	} else {
		a = append(a, "--tmpfs", "/tmp")
	}
	if l.home != "" {
		a = append(a, "--bind", l.home, "/home")
	} else {
		a = append(a, "--tmpfs", "/home")
	}
	for _, m := range l.binds {
		op := "--bind"
		if m.ro {
			op = "--ro-bind"
		}
		a = append(a, op, m.src, m.dst)
	}
	// bwrap builds the new root on a writable tmpfs (it has to create mount
	// points in it); seal it once every mount point exists. Not recursive:
	// the binds above keep their own modes.
	a = append(a, "--remount-ro", "/")
	if l.workdir != "" {
		a = append(a, "--chdir", l.workdir)
	}
	a = append(a, "--clearenv")
	env := map[string]string{"PATH": defaultPath, "HOME": "/home", "PYTHONUNBUFFERED": "1"}
	for k, v := range l.env {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		a = append(a, "--setenv", k, env[k])
	}
	for _, s := range a {
		if strings.ContainsRune(s, 0) {
			return nil, boxerr.Validation("", "sandbox argument contains a NUL byte")
		}
	}
	return a, nil
}

// procHardening binds the host's entries over the sandbox's fresh /proc.
// Using the host's /proc/sys as the source is equivalent: sysctl files
// resolve per-namespace values (net, uts, ipc) through the reading
// process, not through the proc mount.
func procHardening(a []string) []string {
	for _, e := range procReadOnly {
		p := "/proc/" + e
		if _, err := os.Lstat(p); err == nil {
			a = append(a, "--ro-bind", p, p)
		}
	}
	for _, e := range procMasked {
		p := "/proc/" + e
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
		case fi.IsDir():
			a = append(a, "--tmpfs", p, "--remount-ro", p)
		default:
			a = append(a, "--ro-bind", "/dev/null", p)
		}
	}
	return a
}

func hostRoot(a []string, network bool) []string {
	for _, d := range hostSystemDirs {
		fi, err := os.Lstat(d)
		if err != nil {
			continue
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			// merged /usr: /bin -> usr/bin; recreate the link, /usr is bound
			if target, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", target, d)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", d, d)
		}
	}
	etc := hostEtcEntries
	if network {
		etc = append(slices.Clone(etc), "resolv.conf")
	}
	for _, e := range etc {
		p := "/etc/" + e
		// Stat follows symlinks (localtime, resolv.conf): bwrap binds the
		// target, and a dangling link would make bwrap fail.
		if _, err := os.Stat(p); err == nil {
			a = append(a, "--ro-bind", p, p)
		}
	}
	return a
}

// imageRoot binds every top-level entry of the rootfs directory read-only
// into bwrap's tmpfs root (rather than binding the directory itself at /),
// so mount points such as /workspace can be created without writing into
// the image.
func imageRoot(a []string, dir string, network bool) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, boxerr.Validation("image", "rootfs directory %s cannot be read: %v", dir, err).Wrap(err)
	}
	for _, e := range entries {
		name := e.Name()
		if slices.Contains(imageSkip, name) {
			continue
		}
		src, dst := filepath.Join(dir, name), "/"+name
		switch t := e.Type(); {
		case t&fs.ModeSymlink != 0:
			if target, err := os.Readlink(src); err == nil {
				a = append(a, "--symlink", target, dst)
			}
		case t.IsDir() || t.IsRegular():
			a = append(a, "--ro-bind", src, dst)
		}
	}
	if network {
		// The image's resolv.conf is stale at best; show the host's over it
		// when there is a regular file to mount on.
		fi, err := os.Lstat(filepath.Join(dir, "etc", "resolv.conf"))
		if err == nil && fi.Mode().IsRegular() {
			if _, err := os.Stat("/etc/resolv.conf"); err == nil {
				a = append(a, "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf")
			}
		}
	}
	return a, nil
}
