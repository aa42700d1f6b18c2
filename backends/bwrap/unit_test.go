package bwrap

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
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

func TestCheckMountPath(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"/workspace", "/workspace", true},
		{"/a/b/../c/", "/a/c", true},
		{"relative", "", false},
		{"/", "", false},
		{"/x/..", "", false},
		{"/proc", "", false},
		{"/proc/self", "", false},
		{"/dev/shm", "", false},
		{"/devices", "/devices", true},
	}
	for _, tc := range cases {
		got, err := checkMountPath("f", tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("checkMountPath(%q) = %q, %v; want %q ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, boxerr.ErrValidation) {
			t.Errorf("checkMountPath(%q) error is not a validation error: %v", tc.in, err)
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
		{"debian:bookworm", "", false},
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

func TestBwrapArgs(t *testing.T) {
	base := layout{
		userns: true,
		tmp:    "/s/tmp", home: "/s/home",
		binds: []bind{
			{src: "/s/ws", dst: "/workspace"},
			{src: "/h/ref", dst: "/workspace/ref", ro: true},
		},
		workdir: "/workspace",
		env:     map[string]string{"K": "v", "PATH": "/custom"},
	}
	t.Run("network off", func(t *testing.T) {
		a, err := bwrapArgs(base)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range [][]string{
			{"--unshare-all", "--unshare-user", "--disable-userns"},
			{"--die-with-parent"}, {"--new-session"}, {"--cap-drop", "ALL"},
			{"--ro-bind", "/usr", "/usr"},
			{"--proc", "/proc"}, {"--ro-bind", "/proc/sys", "/proc/sys"}, {"--dev", "/dev"},
			{"--bind", "/s/tmp", "/tmp"}, {"--bind", "/s/home", "/home"},
			{"--bind", "/s/ws", "/workspace"}, {"--ro-bind", "/h/ref", "/workspace/ref"},
			{"--remount-ro", "/"}, {"--chdir", "/workspace"}, {"--clearenv"},
			{"--setenv", "HOME", "/home"}, {"--setenv", "K", "v"}, {"--setenv", "PATH", "/custom"},
		} {
			if indexOf(a, want...) < 0 {
				t.Errorf("args lack %q:\n%q", want, a)
			}
		}
		if slices.Contains(a, "--share-net") || indexOf(a, "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf") >= 0 {
			t.Errorf("network off but args share the network or resolv.conf: %q", a)
		}
		if indexOf(a, "--bind", "/s/ws", "/workspace") > indexOf(a, "--ro-bind", "/h/ref", "/workspace/ref") {
			t.Error("child mount before its parent")
		}
		last := indexOf(a, "--ro-bind", "/h/ref", "/workspace/ref")
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
		a, err := bwrapArgs(l)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(a, "--share-net") {
			t.Errorf("network on without --share-net: %q", a)
		}
		if _, err := os.Stat("/etc/resolv.conf"); err == nil && indexOf(a, "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf") < 0 {
			t.Errorf("network on without resolv.conf: %q", a)
		}
	})
	t.Run("no userns", func(t *testing.T) {
		l := base
		l.userns = false
		a, _ := bwrapArgs(l)
		if slices.Contains(a, "--disable-userns") || slices.Contains(a, "--unshare-user") {
			t.Errorf("userns flags without a user namespace: %q", a)
		}
	})
	t.Run("NUL refused", func(t *testing.T) {
		l := base
		l.env = map[string]string{"A": "x\x00y"}
		if _, err := bwrapArgs(l); !errors.Is(err, boxerr.ErrValidation) {
			t.Errorf("NUL in an argument: %v", err)
		}
	})
}

func TestLayoutSortsMounts(t *testing.T) {
	b := &Backend{}
	b.userns.Store(true)
	info := backends.SessionInfo{
		MountPath: "/workspace",
		ExtraMounts: []backends.MountSpec{
			{HostPath: "/h/deep", MountPath: "/workspace/a/b", Mode: backends.MountRW},
			{HostPath: "/h/none", MountPath: "/none", Mode: backends.MountNone},
			{HostPath: "/h/a", MountPath: "/workspace/a", Mode: backends.MountRO},
		},
	}
	l, err := b.layoutFor("/state/s-00000000", info, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var dsts []string
	for _, m := range l.binds {
		dsts = append(dsts, m.dst)
	}
	if !slices.Equal(dsts, []string{"/workspace", "/workspace/a", "/workspace/a/b"}) {
		t.Fatalf("binds in order %v", dsts)
	}
	if l.workdir != "/workspace" || l.binds[0].src != "/state/s-00000000/workspace" || !l.binds[1].ro {
		t.Fatalf("layout %+v", l)
	}
	info.HostPath, info.HostPathMode = "/h/proj", backends.MountRO
	l, _ = b.layoutFor("/state/s-00000000", info, "/workspace/x", nil)
	if l.binds[0].src != "/h/proj" || !l.binds[0].ro {
		t.Fatalf("host_path workspace: %+v", l.binds[0])
	}
	info.HostPathMode = backends.MountNone
	l, _ = b.layoutFor("/state/s-00000000", info, "", nil)
	if l.binds[0].src != "/state/s-00000000/workspace" {
		t.Fatalf("host_path with mode none must use the session workspace: %+v", l.binds[0])
	}
}

func TestPrepareWorkdirStaysInside(t *testing.T) {
	ws := t.TempDir()
	outside := t.TempDir()
	// A command planted a symlink pointing out of the workspace.
	if err := os.Symlink(outside, filepath.Join(ws, "escape")); err != nil {
		t.Fatal(err)
	}
	prepareWorkdir(layout{binds: []bind{{src: ws, dst: "/workspace"}}, workdir: "/workspace/escape/x"})
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Fatal("workdir creation followed a symlink out of the workspace")
	}
	prepareWorkdir(layout{binds: []bind{{src: ws, dst: "/workspace"}}, workdir: "/workspace/a/b"})
	if fi, err := os.Stat(filepath.Join(ws, "a", "b")); err != nil || !fi.IsDir() {
		t.Fatalf("workdir not created: %v", err)
	}
	ro := t.TempDir()
	prepareWorkdir(layout{binds: []bind{{src: ro, dst: "/ref", ro: true}}, workdir: "/ref/new"})
	if _, err := os.Stat(filepath.Join(ro, "new")); err == nil {
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
		{"cannot join", t.TempDir(), false}, // a directory: the write fails
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			statusR, statusW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer statusR.Close()
			var out strings.Builder
			cmd := exec.Command("/bin/sh", "-c", cgroupJoinScript, "join", "1", tc.procs, "/bin/echo", "ran")
			cmd.ExtraFiles = []*os.File{statusW}
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
			if ran := out.String() == "ran\n"; ran != tc.joined {
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
