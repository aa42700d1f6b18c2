package bwrap

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// These tests need neither bwrap nor root.

func TestSanitise(t *testing.T) {
	cases := []struct{ in, want string }{
		{"abc", "abc"},
		{"My Session/../x", "my-session-..-x"},
		{"../..", "session"},
		{"..hidden", "hidden"},
		{"", "session"},
		{"日本語", "session"},
		{"a__b--c..d", "a__b--c..d"},
		{strings.Repeat("x", 40), strings.Repeat("x", 32)},
		{strings.Repeat("x", 31) + "-yyy", strings.Repeat("x", 31)},
	}
	for _, tc := range cases {
		if got := sanitise(tc.in); got != tc.want {
			t.Errorf("sanitise(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if name := newSessionDirName(tc.in); !sessionDirRe.MatchString(name) {
			t.Errorf("newSessionDirName(%q) = %q does not match our own pattern", tc.in, name)
		}
	}
	for _, bad := range []string{"", ".", "..", "../x-00000000", "a/b-00000000", ".x-00000000", "x-0000000g", "X-00000000"} {
		if sessionDirRe.MatchString(bad) {
			t.Errorf("sessionDirRe accepts %q", bad)
		}
	}
}

func TestNewValidatesConfig(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		cfg    Config
		wantOK bool
	}{
		{Config{InstanceID: "prod-1", StateDir: dir}, true},
		{Config{InstanceID: "a.b_c-D", StateDir: dir}, true},
		{Config{InstanceID: "", StateDir: dir}, false},
		{Config{InstanceID: "..", StateDir: dir}, false},
		{Config{InstanceID: ".hidden", StateDir: dir}, false},
		{Config{InstanceID: "a/b", StateDir: dir}, false},
		{Config{InstanceID: strings.Repeat("a", 65), StateDir: dir}, false},
		{Config{InstanceID: "ok", StateDir: " "}, false},
	}
	for _, tc := range cases {
		_, err := New(tc.cfg)
		if (err == nil) != tc.wantOK {
			t.Errorf("New(%+v) error = %v, want ok=%v", tc.cfg, err, tc.wantOK)
		}
		if err != nil && !errors.Is(err, boxerr.ErrValidation) {
			t.Errorf("New(%+v) error %v is not a BoxValidationError", tc.cfg, err)
		}
	}
}

func TestResolveImage(t *testing.T) {
	withSh := t.TempDir()
	if err := os.MkdirAll(filepath.Join(withSh, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withSh, "bin", "sh"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		image, want string
		ok          bool
	}{
		{"", "", true},
		{"host", "", true},
		{" host ", "", true},
		{withSh, withSh, true},
		{withSh + "/", withSh, true},
		{"debian:bookworm", "", false}, // a Docker image reference: bwrap takes "host" or a rootfs path
		{"rootfs", "", false},
		{"/", "", false},
		{file, "", false},
		{t.TempDir(), "", false}, // no /bin/sh
	}
	for _, tc := range cases {
		got, err := resolveImage(tc.image, true)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("resolveImage(%q) = %q, %v; want %q ok=%v", tc.image, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, boxerr.ErrValidation) {
			t.Errorf("resolveImage(%q): %v is not a validation error", tc.image, err)
		}
	}
}

// indexOf finds the position of a run of consecutive arguments.
func indexOf(args []string, run ...string) int {
	for i := 0; i+len(run) <= len(args); i++ {
		if slices.Equal(args[i:i+len(run)], run) {
			return i
		}
	}
	return -1
}

// openDir opens a directory as the O_PATH descriptor layouts hold.
func openDir(t *testing.T, path string) *os.File {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestBwrapArgs(t *testing.T) {
	d := t.TempDir()
	base := layout{
		userns: true,
		tmp:    openDir(t, filepath.Join(d, "tmp")), home: openDir(t, filepath.Join(d, "home")),
		binds: []bind{
			{dir: openDir(t, filepath.Join(d, "ws")), dst: "/workspace"},
			{dir: openDir(t, filepath.Join(d, "ref")), dst: "/workspace/ref", ro: true},
		},
		workdir: "/workspace",
		env:     map[string]string{"K": "v", "PATH": "/custom"},
	}
	t.Run("network off", func(t *testing.T) {
		fds := &fdList{next: 10}
		defer fds.close()
		a, err := bwrapArgs(base, fds)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range [][]string{
			{"--unshare-all", "--unshare-user", "--disable-userns", "--uid", "0", "--gid", "0"},
			{"--die-with-parent"}, {"--new-session"}, {"--cap-drop", "ALL"},
			{"--ro-bind", "/usr", "/usr"},
			{"--proc", "/proc"}, {"--ro-bind", "/proc/sys", "/proc/sys"}, {"--dev", "/dev"},
			{"--bind-fd", "10", "/tmp"}, {"--bind-fd", "11", "/home"},
			{"--bind-fd", "12", "/workspace"}, {"--ro-bind-fd", "13", "/workspace/ref"},
			{"--remount-ro", "/"}, {"--seccomp", "14"}, {"--chdir", "/workspace"}, {"--clearenv"},
			{"--setenv", "HOME", "/home"}, {"--setenv", "K", "v"}, {"--setenv", "PATH", "/custom"},
		} {
			if indexOf(a, want...) < 0 {
				t.Errorf("args lack %q:\n%q", want, a)
			}
		}
		want := []*os.File{base.tmp, base.home, base.binds[0].dir, base.binds[1].dir}
		if len(fds.files) != 5 || !slices.Equal(fds.files[:4], want) || !slices.Equal(fds.owned, fds.files[4:]) {
			t.Errorf("descriptors %v (owned %v), want %v", fds.files, fds.owned, want)
		}
		if slices.Contains(a, "--share-net") || slices.Contains(a, "--ro-bind-data") {
			t.Errorf("network off but args share the network or set resolv.conf: %q", a)
		}
		last := indexOf(a, "--ro-bind-fd", "13", "/workspace/ref")
		if indexOf(a, "--remount-ro", "/") < last {
			t.Error("root sealed before the last mount point was created")
		}
		if indexOf(a, "--clearenv") > indexOf(a, "--setenv", "K", "v") {
			t.Error("--clearenv after --setenv would wipe the request env")
		}
	})
	t.Run("network on", func(t *testing.T) {
		l := base
		l.network = true
		fds := &fdList{next: 10}
		defer fds.close()
		a, err := bwrapArgs(l, fds)
		if err != nil {
			t.Fatal(err)
		}
		// The session's namespace bwrap is started in; never the host's
		// resolver.
		if !slices.Contains(a, "--share-net") || indexOf(a, "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf") >= 0 {
			t.Errorf("network on: %q", a)
		}
		i := indexOf(a, "--ro-bind-data")
		if i < 0 || a[i+2] != "/etc/resolv.conf" {
			t.Fatalf("network on without the proxy's resolv.conf: %q", a)
		}
		n, _ := strconv.Atoi(a[i+1])
		data, err := io.ReadAll(fds.files[n-fds.next])
		if err != nil || string(data) != netResolvConf {
			t.Errorf("resolv.conf %q (%v)", data, err)
		}
	})
	t.Run("fresh tmpfs is bounded", func(t *testing.T) {
		l := layout{userns: true, workdir: "/"}
		fds := &fdList{next: 10}
		defer fds.close()
		a, err := bwrapArgs(l, fds)
		if err != nil {
			t.Fatal(err)
		}
		if indexOf(a, "--size", strconv.Itoa(freshTmpfsBytes), "--tmpfs", "/tmp") < 0 ||
			indexOf(a, "--size", strconv.Itoa(freshTmpfsBytes), "--tmpfs", "/home") < 0 {
			t.Errorf("unbounded tmpfs: %q", a)
		}
	})
	t.Run("no userns", func(t *testing.T) {
		l := base
		l.userns = false
		fds := &fdList{next: 10}
		defer fds.close()
		a, _ := bwrapArgs(l, fds)
		if slices.Contains(a, "--disable-userns") || slices.Contains(a, "--unshare-user") {
			t.Errorf("userns flags without a user namespace: %q", a)
		}
	})
	t.Run("NUL refused", func(t *testing.T) {
		l := base
		l.env = map[string]string{"A": "x\x00y"}
		if _, err := bwrapArgs(l, &fdList{next: 10}); !errors.Is(err, boxerr.ErrValidation) {
			t.Errorf("NUL in an argument: %v", err)
		}
	})
}

func TestLayoutSortsMounts(t *testing.T) {
	d := t.TempDir()
	b := &Backend{open: map[string]*sessionFiles{}}
	b.userns.Store(true)
	sf := b.files("s-00000000")
	sf.ws, sf.tmp, sf.home = openDir(t, filepath.Join(d, "ws")), openDir(t, filepath.Join(d, "tmp")), openDir(t, filepath.Join(d, "home"))
	t.Cleanup(func() { sf.host = nil }) // openDir's cleanup closes them
	host := func(name string) string { return filepath.Join(d, "h", name) }
	info := backends.Session{Sandbox: backends.Sandbox{
		MountPath: "/workspace",
		ExtraMounts: []backends.MountSpec{
			{HostPath: host("deep"), MountPath: "/workspace/a/b", Mode: backends.MountRW},
			{HostPath: host("none"), MountPath: "/none", Mode: backends.MountNone},
			{HostPath: host("a"), MountPath: "/workspace/a", Mode: backends.MountRO},
		},
	}}
	l, err := b.layoutFor(sf, d, info, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var dsts, srcs []string
	for _, m := range l.binds {
		dsts = append(dsts, m.dst)
		srcs = append(srcs, m.dir.Name())
	}
	if !slices.Equal(dsts, []string{"/workspace", "/workspace/a", "/workspace/a/b"}) {
		t.Fatalf("binds in order %v", dsts)
	}
	if !slices.Equal(srcs, []string{sf.ws.Name(), host("a"), host("deep")}) || !l.binds[1].ro || l.workdir != "/workspace" {
		t.Fatalf("layout %v %+v", srcs, l)
	}
	if _, err := os.Stat(host("none")); err == nil {
		t.Error("a mount with mode none was created")
	}
	info.HostPath, info.HostPathMode = host("proj"), backends.MountRO
	l, _ = b.layoutFor(sf, d, info, "/workspace/x", nil)
	if l.binds[0].dir.Name() != host("proj") || !l.binds[0].ro {
		t.Fatalf("host_path workspace: %+v", l.binds[0])
	}
	info.HostPathMode = backends.MountNone
	l, _ = b.layoutFor(sf, d, info, "", nil)
	if l.binds[0].dir != sf.ws {
		t.Fatalf("host_path with mode none must use the session workspace: %+v", l.binds[0])
	}
	// A host path is opened once: replacing it by a symlink later changes
	// nothing for the session.
	if err := os.Rename(host("a"), host("a.moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", host("a")); err != nil {
		t.Fatal(err)
	}
	l, err = b.layoutFor(sf, d, info, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(l.binds[1].dir.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	var moved unix.Stat_t
	if err := unix.Stat(host("a.moved"), &moved); err != nil || st.Ino != moved.Ino {
		t.Fatalf("the session's mount now names another directory (ino %d, want %d)", st.Ino, moved.Ino)
	}
}

func TestOpenHostDirRefusesSymlinks(t *testing.T) {
	d := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(d, "link")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path string
		create     bool
	}{
		{"symlink itself", filepath.Join(d, "link"), false},
		{"symlink on the way", filepath.Join(d, "link", "ssl"), false},
		{"creating through a symlink", filepath.Join(d, "link", "boxrt-created"), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := openHostDir("host_path", tc.path, tc.create, false, identity{})
			if err == nil {
				f.Close()
				t.Fatalf("opened %s through a symlink", tc.path)
			}
			if !errors.Is(err, boxerr.ErrValidation) {
				t.Errorf("error %v is not a validation error", err)
			}
		})
	}
	if _, err := os.Stat("/etc/boxrt-created"); err == nil {
		t.Fatal("a directory was created through the symlink in /etc")
	}
}

// TestPrepareMountsRefusesSymlinks: a command planted symlinks where the
// next sandbox mounts something or starts in; nothing may be created
// through them, and a mount point behind one fails the start.
func TestPrepareMountsRefusesSymlinks(t *testing.T) {
	d := t.TempDir()
	ws, outside := filepath.Join(d, "ws"), filepath.Join(d, "outside")
	wsDir, skill := openDir(t, ws), openDir(t, filepath.Join(d, "skill"))
	openDir(t, outside)
	if err := os.Symlink("../outside", filepath.Join(ws, "escape")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		l       layout
		wantErr bool
		created string // must exist afterwards (relative to ws)
	}{
		{"mount point behind a symlink", layout{binds: []bind{{dir: wsDir, dst: "/workspace"}, {dir: skill, dst: "/workspace/escape/x"}}, workdir: "/"}, true, ""},
		{"workdir behind a symlink", layout{binds: []bind{{dir: wsDir, dst: "/workspace"}}, workdir: "/workspace/escape/x"}, false, ""},
		{"plain mount point", layout{binds: []bind{{dir: wsDir, dst: "/workspace"}, {dir: skill, dst: "/workspace/.skills/s"}}, workdir: "/"}, false, ".skills/s"},
		{"plain workdir", layout{binds: []bind{{dir: wsDir, dst: "/workspace"}}, workdir: "/workspace/a/b"}, false, "a/b"},
		{"read-only parent", layout{binds: []bind{{dir: wsDir, dst: "/ref", ro: true}}, workdir: "/ref/new"}, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := prepareMounts(tc.l, identity{})
			if (err != nil) != tc.wantErr {
				t.Fatalf("prepareMounts: %v, want error %v", err, tc.wantErr)
			}
			if entries, _ := os.ReadDir(outside); len(entries) > 0 {
				t.Fatalf("created %v through the symlink", entries)
			}
			if tc.created != "" {
				if fi, err := os.Stat(filepath.Join(ws, tc.created)); err != nil || !fi.IsDir() {
					t.Fatalf("%s not created: %v", tc.created, err)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(ws, "new")); err == nil {
		t.Fatal("workdir created inside a read-only mount")
	}
}

func TestReadCgroupMounts(t *testing.T) {
	const sample = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
42 31 0:39 / /mnt/with\040space rw - cgroup2 cgroup2 rw
`
	p := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(p, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	ms, err := readCgroupMounts(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 4 {
		t.Fatalf("got %d cgroup mounts: %+v", len(ms), ms)
	}
	if ms[0].point != "/sys/fs/cgroup/cpu,cpuacct" || !slices.Contains(ms[0].superOpts, "cpu") || ms[0].fstype != "cgroup" {
		t.Errorf("cpu mount parsed as %+v", ms[0])
	}
	if ms[1].root != "/docker/abc" {
		t.Errorf("memory mount root %q", ms[1].root)
	}
	if ms[3].point != "/mnt/with space" {
		t.Errorf("escaped mount point parsed as %q", ms[3].point)
	}

	own := filepath.Join(t.TempDir(), "cgroup")
	if err := os.WriteFile(own, []byte("9:name=systemd:/\n4:memory:/docker/abc/x\n1:cpu,cpuacct:/\n0::/user.slice\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readOwnCgroups(own)
	if err != nil {
		t.Fatal(err)
	}
	if got["memory"] != "/docker/abc/x" || got["cpu"] != "/" || got["cpuacct"] != "/" || got[""] != "/user.slice" {
		t.Errorf("own cgroups %v", got)
	}
}

func TestRemoveTreeUnreadableDirs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	locked := filepath.Join(dir, "workspace", "a", "b")
	if err := os.MkdirAll(locked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(locked, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{locked, filepath.Dir(locked)} {
		if err := os.Chmod(d, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := removeTree(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("still there: %v", err)
	}
}

// TestCgroupJoinScript checks the v1 placement wrapper both ways: a joined
// cgroup reports "ok" and execs the command; a failed join reports nothing
// and never runs it.
func TestCgroupJoinScript(t *testing.T) {
	procs := filepath.Join(t.TempDir(), "cgroup.procs")
	if err := os.WriteFile(procs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		procs  string
		joined bool
	}{
		{"joins", procs, true},
		{"cannot join", "/dev/full", false}, // the write fails with ENOSPC
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			statusR, statusW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer statusR.Close()
			pf, err := os.OpenFile(tc.procs, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer pf.Close()
			var out strings.Builder
			cmd := exec.Command("/bin/sh", "-c", cgroupJoinScript, "join", "1", "/bin/sh", "-c", "echo ran; [ -e /proc/self/fd/4 ] || [ -e /proc/self/fd/5 ] || echo closed")
			cmd.ExtraFiles = []*os.File{nil, statusW, pf}
			cmd.Stdout = &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			statusW.Close()
			joined := joinedCgroups(statusR)
			err = cmd.Wait()
			if joined != tc.joined {
				t.Fatalf("joined = %v, want %v (wait: %v)", joined, tc.joined, err)
			}
			// The command does not inherit the status pipe or cgroup.procs.
			if ran := out.String() == "ran\nclosed\n"; ran != tc.joined {
				t.Fatalf("command ran = %v after joined = %v (out %q)", ran, joined, out.String())
			}
			if tc.joined {
				data, _ := os.ReadFile(tc.procs)
				if strings.TrimSpace(string(data)) != strconv.Itoa(cmd.Process.Pid) {
					t.Fatalf("wrote %q to cgroup.procs, want the pid that became the command (%d)", data, cmd.Process.Pid)
				}
			}
		})
	}
}

func TestParseStatPPID(t *testing.T) {
	cases := []struct {
		stat string
		want int
	}{
		{"123 (sh) S 45 123 123 0 -1", 45},
		{"123 (a) b) c) R 7 1", 7},
		{"123 (weird name) S 1 1", 1},
		{"garbage", -1},
		{"1 (x)", -1},
	}
	for _, tc := range cases {
		if got := parseStatPPID(tc.stat); got != tc.want {
			t.Errorf("parseStatPPID(%q) = %d, want %d", tc.stat, got, tc.want)
		}
	}
}

// TestChildren lists a shell's two background children from its task's
// children file and from the scan of every process, which must agree.
func TestChildren(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range scanChildren(cmd.Process.Pid) {
			_ = unix.Kill(c, unix.SIGKILL)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if !taskChildrenListed() {
		t.Fatal("this kernel does not list a task's children (CONFIG_PROC_CHILDREN); the scan is the only way, and slow")
	}
	var want []int
	for range 500 {
		if want = scanChildren(cmd.Process.Pid); len(want) == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(want) != 2 {
		t.Fatalf("the shell has %d children, want its 2 sleeps", len(want))
	}
	got := children(cmd.Process.Pid)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("children = %v, the scan found %v", got, want)
	}
	if got := children(1 << 30); got != nil {
		t.Fatalf("children of a pid that does not exist = %v", got)
	}
}

// TestCounterFilesReadAfresh: counter reads its held files from the start
// each time (a changed value is seen), finds a key in the first directory
// that has the file, reads 0 where none has it, and opens the files again
// after close.
func TestCounterFilesReadAfresh(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	write := func(dir, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "pids.events"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cg := &cgroup{m: &cgroupManager{}, dirs: []string{a, b}}
	write(b, "max 3\n")
	if n := cg.counter("pids.events", "max"); n != 3 {
		t.Fatalf("counter = %d, want 3", n)
	}
	write(b, "max 12\n")
	if n := cg.counter("pids.events", "max"); n != 12 {
		t.Fatalf("counter after a change = %d, want 12", n)
	}
	if n := cg.counter("memory.events", "oom_kill"); n != 0 {
		t.Fatalf("counter of a missing file = %d, want 0", n)
	}
	cg.files.close()
	write(b, "max 7\n")
	if n := cg.counter("pids.events", "max", b); n != 7 {
		t.Fatalf("counter after close = %d, want 7", n)
	}
	cg.files.close()
	if cg.files.fds != nil {
		t.Fatalf("close left %v open", cg.files.fds)
	}
}
