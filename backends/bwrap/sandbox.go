package bwrap

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
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
// (/run: the agent's binds are made below it, which an image's read-only
// /run would not allow.)
var imageSkip = []string{"proc", "dev", "tmp", "home", "run"}

// bind is a host directory bound into the sandbox through its descriptor.
type bind struct {
	dir *os.File
	dst string
	ro  bool
}

// layout is everything one bwrap invocation needs besides the command.
type layout struct {
	image   *os.File // nil = host system directories, else a rootfs directory
	network bool
	netns   *os.File // the session's network namespace (network only)
	// ca is the egress session's CA bundle (hosts that carry a secret),
	// bound read-only at egressCAPath; nil without secrets.
	ca      []byte
	userns  bool
	tmp     *os.File // bound at /tmp (nil = a fresh tmpfs)
	home    *os.File // bound at /home (nil = a fresh tmpfs)
	binds   []bind   // workspace and extra mounts, shallow first
	workdir string
	env     map[string]string
	agent   *agentMounts // the session agent's binds (resident sandbox only)
	// persist: the sandbox outlives boxrt (a persistent session's: see
	// persist.go), so no --die-with-parent.
	persist bool
}

// fdList collects the descriptors bwrap inherits, numbered from next in
// the order they are added; owned ones are closed once bwrap has started.
type fdList struct {
	next  int
	files []*os.File
	owned []*os.File
}

func (f *fdList) add(file *os.File, owned bool) string {
	n := f.next + len(f.files)
	f.files = append(f.files, file)
	if owned {
		f.owned = append(f.owned, file)
	}
	return strconv.Itoa(n)
}

func (f *fdList) close() {
	for _, file := range f.owned {
		file.Close()
	}
	f.owned = nil
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

// layoutFor builds the sandbox layout of a session from the Session the
// runtime passes in (so mounts may change between execs) and the session's
// descriptors: every host directory is opened once per session, without
// following symlinks, and only ever mounted through its descriptor.
func (b *Backend) layoutFor(sf *sessionFiles, dir string, info backends.Session, workdir string, env map[string]string) (layout, error) {
	imageDir, err := resolveImage(info.Image, false)
	if err != nil {
		return layout{}, err
	}
	mountPath, err := backends.CheckMountPath("mount_path", info.MountPathOrDefault())
	if err != nil {
		return layout{}, err
	}
	if workdir == "" {
		workdir = mountPath
	}
	if !filepath.IsAbs(workdir) || strings.ContainsRune(workdir, 0) {
		return layout{}, boxerr.Validation("workdir", "workdir must be absolute, got %q", workdir)
	}
	if err := checkEnv("env", env); err != nil {
		return layout{}, err
	}
	ws, tmp, home, err := sf.storage(b, dir)
	if err != nil {
		return layout{}, boxerr.Failure("bwrap: session storage: %v", err).Wrap(err)
	}
	var image *os.File
	if imageDir != "" {
		if image, err = sf.hostDir(b, "image", imageDir, false, false); err != nil {
			return layout{}, err
		}
	}
	wsBind := bind{dir: ws, dst: mountPath}
	if info.HostPath != "" && info.HostPathMode != backends.MountNone {
		rw := info.HostPathMode == backends.MountRW
		if wsBind.dir, err = sf.hostDir(b, "host_path", info.HostPath, true, rw); err != nil {
			return layout{}, err
		}
		wsBind.ro = !rw
	}
	var netns *os.File
	var ca []byte
	if info.Network.Egress() {
		if netns, err = sf.network(b, info); err != nil {
			return layout{}, err
		}
		var egEnv map[string]string
		if egEnv, ca, err = sf.egressEnv(); err != nil {
			return layout{}, err
		}
		env = withDefaults(env, egEnv)
	}
	binds := []bind{wsBind}
	for i, m := range info.ExtraMounts {
		if m.Mode == backends.MountNone {
			continue
		}
		field := fmt.Sprintf("extra_mounts[%d]", i)
		dst, err := backends.CheckMountPath(field+".mount_path", m.MountPath)
		if err != nil {
			return layout{}, err
		}
		rw := m.Mode == backends.MountRW
		d, err := sf.hostDir(b, field+".host_path", m.HostPath, true, rw)
		if err != nil {
			return layout{}, err
		}
		binds = append(binds, bind{dir: d, dst: dst, ro: !rw})
	}
	// bwrap applies mounts in order, so a parent mounted after its child
	// would hide it: mount shallow paths first.
	sort.SliceStable(binds, func(i, j int) bool { return depth(binds[i].dst) < depth(binds[j].dst) })
	return layout{
		image:   image,
		network: netns != nil,
		netns:   netns,
		ca:      ca,
		userns:  b.userns.Load(),
		tmp:     tmp,
		home:    home,
		binds:   binds,
		workdir: filepath.Clean(workdir),
		env:     env,
	}, nil
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

// bwrapArgs turns a layout into bwrap options (everything before the
// command), adding the descriptors they name to fds. They travel through
// --args on a memfd, never on bwrap's command line, so env values (API
// keys…) are not visible in the host's process list.
func bwrapArgs(l layout, fds *fdList) ([]string, error) {
	a := []string{"--unshare-all"}
	if l.userns {
		// A user namespace of our own lets --disable-userns forbid nested
		// ones, closing a large kernel attack surface to the command. The
		// command is uid 0 inside it, which is the unprivileged sandbox
		// user (or boxrt's own user) outside.
		a = append(a, "--unshare-user", "--disable-userns", "--uid", "0", "--gid", "0")
	}
	if l.network {
		// The session's own namespace, which bwrap is started in (net.go);
		// never the host's.
		a = append(a, "--share-net")
	}
	if !l.persist {
		a = append(a, "--die-with-parent") // bwrap's death (boxrt's, our kill) takes the namespace down
	}
	a = append(a,
		"--new-session",     // no controlling terminal: no TIOCSTI injection
		"--cap-drop", "ALL", // root in the sandbox keeps no capabilities
		"--hostname", "boxrt",
	)
	var err error
	resolv := l.network
	if l.image == nil {
		a = hostRoot(a)
	} else if a, resolv, err = imageRoot(a, l.image, l.network, fds); err != nil {
		return nil, err
	}
	if resolv {
		// The egress proxy's resolver answers port 53 of any address
		// (net.go), whatever the host's resolv.conf says.
		f, err := memFile("boxrt-resolv.conf", []byte(netResolvConf))
		if err != nil {
			return nil, err
		}
		a = append(a, "--ro-bind-data", fds.add(f, true), "/etc/resolv.conf")
	}
	if l.ca != nil {
		f, err := memFile("boxrt-egress-ca.pem", l.ca)
		if err != nil {
			return nil, err
		}
		a = append(a, "--ro-bind-data", fds.add(f, true), egressCAPath)
	}
	a = append(a, "--proc", "/proc")
	a = procHardening(a)
	a = append(a, "--dev", "/dev")
	for _, m := range []struct {
		dir *os.File
		dst string
	}{{l.tmp, "/tmp"}, {l.home, "/home"}} {
		if m.dir != nil {
			a = append(a, "--bind-fd", fds.add(m.dir, false), m.dst)
		} else {
			a = append(a, "--size", strconv.Itoa(freshTmpfsBytes), "--tmpfs", m.dst)
		}
	}
	for _, m := range l.binds {
		op := "--bind-fd"
		if m.ro {
			op = "--ro-bind-fd"
		}
		a = append(a, op, fds.add(m.dir, false), m.dst)
	}
	if l.agent != nil {
		a = append(a, "--ro-bind", l.agent.bin, agentBinPath, "--ro-bind", l.agent.sock, agentSockDir)
	}
	// bwrap builds the new root on a writable tmpfs (it has to create mount
	// points in it); seal it once every mount point exists. Not recursive:
	// the binds above keep their own modes.
	a = append(a, "--remount-ro", "/")
	filter, err := seccompFile()
	if err != nil {
		return nil, err
	}
	a = append(a, "--seccomp", fds.add(filter, true))
	if l.workdir != "" {
		a = append(a, "--chdir", l.workdir)
	}
	a = append(a, "--clearenv")
	for _, kv := range sandboxEnv(l.env) {
		k, v, _ := strings.Cut(kv, "=")
		a = append(a, "--setenv", k, v)
	}
	for _, s := range a {
		if strings.ContainsRune(s, 0) {
			return nil, boxerr.Validation("", "sandbox argument contains a NUL byte")
		}
	}
	return a, nil
}

// sandboxEnv is the complete environment of a sandboxed command, sorted:
// a fixed PATH, HOME=/home and env (checked by layoutFor) over them.
// withDefaults is env over defaults (the caller's env wins).
func withDefaults(env, defaults map[string]string) map[string]string {
	if len(defaults) == 0 {
		return env
	}
	out := maps.Clone(defaults)
	maps.Copy(out, env)
	return out
}

func sandboxEnv(env map[string]string) []string {
	all := map[string]string{"PATH": defaultPath, "HOME": "/home", "PYTHONUNBUFFERED": "1"}
	for k, v := range env {
		all[k] = v
	}
	out := make([]string, 0, len(all))
	for k, v := range all {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// freshTmpfsBytes bounds a /tmp or /home that is a fresh tmpfs rather than
// the session's disk (only the probe's sandbox has those).
const freshTmpfsBytes = 64 << 20

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

func hostRoot(a []string) []string {
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
	for _, e := range hostEtcEntries {
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
// the image. Entries are opened below the image's descriptor without
// following symlinks (a symlink entry is re-created as a symlink).
// resolv reports whether the sandbox gets our resolv.conf: with network,
// when the image has a regular /etc/resolv.conf to mount it on.
func imageRoot(a []string, image *os.File, network bool, fds *fdList) (_ []string, resolv bool, _ error) {
	fd, err := unix.Openat(int(image.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, boxerr.Validation("image", "rootfs directory %s cannot be read: %v", image.Name(), err).Wrap(err)
	}
	d := os.NewFile(uintptr(fd), image.Name())
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return nil, false, boxerr.Validation("image", "rootfs directory %s cannot be read: %v", image.Name(), err).Wrap(err)
	}
	slices.SortFunc(entries, func(x, y fs.DirEntry) int { return strings.Compare(x.Name(), y.Name()) })
	for _, e := range entries {
		name := e.Name()
		if slices.Contains(imageSkip, name) {
			continue
		}
		dst := "/" + name
		switch t := e.Type(); {
		case t&fs.ModeSymlink != 0:
			if target, err := readlinkat(int(image.Fd()), name); err == nil {
				a = append(a, "--symlink", target, dst)
			}
		case t.IsDir() || t.IsRegular():
			efd, err := unix.Openat(int(image.Fd()), name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue // gone since ReadDir
			}
			a = append(a, "--ro-bind-fd", fds.add(os.NewFile(uintptr(efd), name), true), dst)
		}
	}
	if network {
		var st unix.Stat_t
		err := unix.Fstatat(int(image.Fd()), "etc/resolv.conf", &st, unix.AT_SYMLINK_NOFOLLOW)
		resolv = err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
	}
	return a, resolv, nil
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
