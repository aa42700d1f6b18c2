package bwrap

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// cgroupVersion is which cgroup interface boxrt drives on this machine.
type cgroupVersion int

const (
	cgroupNone cgroupVersion = iota
	cgroupV1
	cgroupV2
)

func (v cgroupVersion) String() string {
	switch v {
	case cgroupV1:
		return "cgroup v1"
	case cgroupV2:
		return "cgroup v2"
	}
	return "no cgroups"
}

// Wire names of the limits (backends.Description.EnforcedLimits) and the
// controllers that enforce them.
const (
	limitMemory = "memory"
	limitPids   = "pids"
	limitCPUs   = "cpus"
)

var controllerOf = map[string]string{limitMemory: "memory", limitPids: "pids", limitCPUs: "cpu"}

// wantedControllers in the order EnforcedLimits lists them.
var wantedControllers = []string{"memory", "pids", "cpu"}

// v1Controllers adds cpuacct on v1, where CPU time is counted by its own
// controller (a session's metrics read cpuacct.usage); v2's cpu.stat
// counts it without one. It enforces nothing.
var v1Controllers = append(slices.Clone(wantedControllers), "cpuacct")

// cgroupParentName is the directory every boxrt installation on the machine
// shares; below it each installation has a directory named after its
// instance id, and below that one leaf per exec / managed process.
const cgroupParentName = "boxrt"

// cpuPeriodUS is the CFS period used for the cpus limit (the kernel default).
const cpuPeriodUS = 100000

// pidsOverhead is added to the session's pids limit so that the resident
// sandbox's own tasks, which live in the same cgroup, do not eat into what
// the session's commands may fork: bwrap's two processes (the outer monitor
// and the namespace's init) and the agent's threads.
const pidsOverhead = 2 + sandboxagent.MaxThreads

// cgroupManager knows where boxrt's cgroups live on this machine and which
// controllers it can use. It is built once by New (a handful of small reads
// and mkdirs) so Describe can answer without I/O.
type cgroupManager struct {
	version cgroupVersion
	// bases are the directories under which cgroupParentName lives: one for
	// v2 (the unified mount), one per controller hierarchy for v1.
	bases []cgroupBase
	// controllers usable below our parent (subset of wantedControllers).
	controllers []string
	// v2Kill: cgroup.kill exists (kernel >= 5.14).
	v2Kill bool
	// noCloneInto: clone3 cannot place a child into a cgroup (kernel < 5.7);
	// v2 then uses the join script like v1. Learnt on the first start.
	noCloneInto atomic.Bool
	// swapLimited: swap can be capped too (memory.swap.max / memsw).
	swapLimited bool
	notes       []string

	// mu serialises creating and pruning the shared parent directories
	// within this process, so our own goroutines never race an rmdir of a
	// parent against a mkdir below it. Other processes sharing the parent are
	// handled by retrying on ENOENT.
	mu sync.Mutex
}

type cgroupBase struct {
	dir         string // e.g. /sys/fs/cgroup/memory/some/own/path
	controllers []string
	// mount and mountRoot are the hierarchy's mount point and the path
	// of the hierarchy it exposes there (mountinfo's root): v1 placement
	// maps a thread's /proc cgroup path to a directory with them.
	mount, mountRoot string
	// prune: remove empty parents after the last leaf goes. Done on v1,
	// where the parent sits inside our own cgroup and must not block its
	// owner from removing it; on v2 the parent is at the hierarchy root and
	// its subtree_control setup would have to be redone, so it stays.
	prune bool
}

type limits struct {
	memoryMB int
	pids     int
	cpus     float64
}

// mountInfo is one cgroup line of /proc/self/mountinfo.
type mountInfo struct {
	root, point, fstype string
	superOpts           []string
}

func readCgroupMounts(path string) ([]mountInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root point opts [optional...] - fstype source superopts
		left, right, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		lf := strings.Fields(left)
		rf := strings.Fields(right)
		if len(lf) < 5 || len(rf) < 3 {
			continue
		}
		if rf[0] != "cgroup" && rf[0] != "cgroup2" {
			continue
		}
		out = append(out, mountInfo{
			root:      unescapeMount(lf[3]),
			point:     unescapeMount(lf[4]),
			fstype:    rf[0],
			superOpts: strings.Split(rf[2], ","),
		})
	}
	return out, sc.Err()
}

// unescapeMount undoes the octal escapes (\040 for a space…) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// readOwnCgroups parses /proc/self/cgroup into controller → path ("" key for
// the v2 unified entry).
func readOwnCgroups(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for c := range strings.SplitSeq(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// detectCgroups picks the cgroup interface: v2 when the unified hierarchy
// has any of memory/pids/cpu, else v1 hierarchies for those controllers,
// else none (limits not enforced; processes are still killed through the
// pid namespace).
func detectCgroups(instance string) *cgroupManager {
	mounts, err := readCgroupMounts("/proc/self/mountinfo")
	if err != nil {
		return &cgroupManager{notes: []string{"cgroups: cannot read /proc/self/mountinfo: " + err.Error()}}
	}
	own, err := readOwnCgroups("/proc/self/cgroup")
	if err != nil {
		own = map[string]string{}
	}
	var notes []string
	for _, m := range mounts {
		if m.fstype != "cgroup2" {
			continue
		}
		avail := readWords(filepath.Join(m.point, "cgroup.controllers"))
		if !slices.ContainsFunc(wantedControllers, func(c string) bool { return slices.Contains(avail, c) }) {
			continue // e.g. the controller-less unified mount of a hybrid host
		}
		cm := setupV2(m.point, instance)
		if cm.version == cgroupV2 {
			return cm
		}
		notes = append(notes, cm.notes...)
	}
	if cm := setupV1(mounts, own, instance); cm.version == cgroupV1 {
		return cm
	}
	return &cgroupManager{notes: append(notes, "no usable cgroup controllers (memory, pids, cpu) for boxrt here (not root, or cgroupfs read-only): "+
		"memory, pids and cpus limits are NOT enforced; processes are still confined and killed through their pid namespace")}
}

// setupV2 prepares <mount>/boxrt/<instance> with every wanted controller
// the root offers enabled for its children. Controllers that cannot be
// enabled are simply not enforced; a v2 manager with none of them still
// places, tracks and kills process trees (cgroup.kill), which is how the
// tests drive this code on hybrid hosts whose unified hierarchy has no
// controllers. The parents stay after use: they sit at the hierarchy root,
// where they block nobody, and re-creating them would mean redoing the
// subtree_control setup under a race with other installations.
func setupV2(mount, instance string) *cgroupManager {
	cm := &cgroupManager{version: cgroupV2}
	avail := readWords(filepath.Join(mount, "cgroup.controllers"))
	var want []string
	for _, c := range wantedControllers {
		if slices.Contains(avail, c) {
			want = append(want, c)
		}
	}
	// The root cgroup is exempt from the no-internal-processes rule, so
	// enabling controllers for its children works even though processes live
	// in it. Already-enabled controllers make this a no-op.
	for _, c := range want {
		_ = writeFile(filepath.Join(mount, "cgroup.subtree_control"), "+"+c)
	}
	enabled := readWords(filepath.Join(mount, "cgroup.subtree_control"))
	want = slices.DeleteFunc(want, func(c string) bool { return !slices.Contains(enabled, c) })
	cm.bases = []cgroupBase{{dir: mount, controllers: want}}

	// Creating our own instance directory (not just finding the shared
	// parent, which another installation or user may own) is the proof
	// that leaves can be made; what its subtree_control accepted is what
	// the leaves will enforce.
	inst, err := cm.mkParents(cm.bases[0], instance)
	if err != nil {
		return &cgroupManager{notes: []string{fmt.Sprintf("cgroup v2 at %s is not usable by boxrt (%v): limits are NOT enforced", mount, err)}}
	}
	enabled = readWords(filepath.Join(inst, "cgroup.subtree_control"))
	for _, c := range want {
		if slices.Contains(enabled, c) {
			cm.controllers = append(cm.controllers, c)
		}
	}
	cm.bases[0].controllers = cm.controllers
	cm.v2Kill = exists(filepath.Join(inst, "cgroup.kill"))
	if slices.Contains(cm.controllers, "memory") {
		// memory.swap.max exists in non-root cgroups only, and only with
		// swap accounting on.
		cm.swapLimited = exists(filepath.Join(inst, "memory.swap.max"))
	}
	cm.notes = append(cm.notes, fmt.Sprintf("cgroup v2 at %s (controllers: %s)", filepath.Dir(inst), strings.Join(cm.controllers, ", ")))
	return cm
}

// setupV1 finds, for each wanted controller, its v1 hierarchy and a writable
// place for our parent: preferably inside our own cgroup of that hierarchy
// (so a service manager that accounts or kills our cgroup covers the
// sandboxes too), else at the hierarchy root.
func setupV1(mounts []mountInfo, own map[string]string, instance string) *cgroupManager {
	cm := &cgroupManager{version: cgroupV1}
	// One base per distinct mount; co-mounted controllers (cpu,cpuacct)
	// share it.
	byPoint := map[string]int{}
	var failures []string
	for _, c := range v1Controllers {
		var m *mountInfo
		for i := range mounts {
			if mounts[i].fstype == "cgroup" && slices.Contains(mounts[i].superOpts, c) {
				m = &mounts[i]
				break
			}
		}
		if m == nil {
			continue
		}
		if i, ok := byPoint[m.point]; ok {
			cm.bases[i].controllers = append(cm.bases[i].controllers, c)
			cm.controllers = append(cm.controllers, c)
			continue
		}
		var candidates []string
		if p, ok := own[c]; ok {
			// /proc/self/cgroup paths are relative to the hierarchy root;
			// the mount may expose only a subtree of it (mountinfo root).
			rel, ok := p, true
			if m.root != "/" {
				rel, ok = strings.CutPrefix(p, m.root)
			}
			if rel = strings.Trim(rel, "/"); ok && rel != "" {
				candidates = append(candidates, filepath.Join(m.point, rel))
			}
		}
		candidates = append(candidates, m.point)
		placed := false
		for _, base := range candidates {
			if usableV1Base(base, instance, c) {
				byPoint[m.point] = len(cm.bases)
				cm.bases = append(cm.bases, cgroupBase{dir: base, controllers: []string{c}, prune: true, mount: m.point, mountRoot: m.root})
				cm.controllers = append(cm.controllers, c)
				placed = true
				break
			}
		}
		if !placed {
			failures = append(failures, c)
		}
	}
	if len(cm.controllers) == 0 {
		return &cgroupManager{}
	}
	for _, b := range cm.bases {
		if slices.Contains(b.controllers, "memory") {
			cm.swapLimited = exists(filepath.Join(b.dir, "memory.memsw.limit_in_bytes"))
		}
	}
	var where []string
	for _, b := range cm.bases {
		where = append(where, filepath.Join(b.dir, cgroupParentName))
	}
	cm.notes = append(cm.notes, fmt.Sprintf("cgroup v1 (controllers: %s) under %s", strings.Join(cm.controllers, ", "), strings.Join(where, ", ")))
	if len(failures) > 0 {
		cm.notes = append(cm.notes, "cgroup v1 controllers present but not writable: "+strings.Join(failures, ", "))
	}
	return cm
}

// usableV1Base reports whether base/boxrt/<instance> can be created and
// has the controller's limit file. Only creating our own directory proves
// it: the shared parent may exist but belong to someone else. What the
// check created is removed again (v1 parents are pruned when unused).
func usableV1Base(base, instance, controller string) bool {
	m := &cgroupManager{version: cgroupV1}
	b := cgroupBase{dir: base, controllers: []string{controller}, prune: true}
	inst, err := m.mkParents(b, instance)
	if err != nil {
		return false
	}
	file := map[string]string{"memory": "memory.limit_in_bytes", "pids": "pids.max", "cpu": "cpu.cfs_quota_us", "cpuacct": "cpuacct.usage"}[controller]
	ok := exists(filepath.Join(inst, file))
	if syscall.Rmdir(inst) == nil {
		_ = syscall.Rmdir(filepath.Dir(inst))
	}
	return ok
}

// enforcedLimits names the limits the usable controllers enforce.
func (m *cgroupManager) enforcedLimits() []string {
	out := []string{}
	for _, l := range []string{limitMemory, limitPids, limitCPUs} {
		if slices.Contains(m.controllers, controllerOf[l]) {
			out = append(out, l)
		}
	}
	return out
}

// cgroup is one leaf (per exec or managed process), present in every
// hierarchy the manager uses.
type cgroup struct {
	m    *cgroupManager
	dirs []string // leaf directory per base, same order as m.bases
	// cmds is the commands' child of the leaf in the v1 pids hierarchy
	// that boxrt made before the agent shared the leaf with them ("":
	// none); a sandbox it still holds is adopted with it, and counted and
	// removed with it.
	cmds string
	// files: the counter files counter keeps open.
	files counterFiles
}

// create makes <base>/boxrt/<instance>/<leaf> in every hierarchy and applies
// the limits. The caller places the process (see Backend.start in launch.go).
func (m *cgroupManager) create(instance, leaf string, lim limits) (*cgroup, error) {
	if m.version == cgroupNone {
		return nil, nil
	}
	cg := &cgroup{m: m}
	for _, b := range m.bases {
		dir, err := m.mkLeaf(b, instance, leaf)
		if err != nil {
			cg.remove()
			return nil, err
		}
		cg.dirs = append(cg.dirs, dir)
	}
	if err := cg.apply(lim); err != nil {
		cg.remove()
		return nil, err
	}
	return cg, nil
}

func (m *cgroupManager) mkLeaf(b cgroupBase, instance, leaf string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	// Another boxrt installation may prune the shared parent between our
	// mkdirs; its rmdir only succeeds on an empty directory, so retrying
	// converges quickly.
	for range 5 {
		var inst string
		if inst, err = m.mkParents(b, instance); err == nil {
			dir := filepath.Join(inst, leaf)
			if err = os.Mkdir(dir, 0o755); err == nil {
				return dir, nil
			}
		}
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	return "", fmt.Errorf("create cgroup %s/%s/%s/%s: %w", b.dir, cgroupParentName, instance, leaf, err)
}

// mkParents makes <base>/boxrt/<instance> (either may exist already) and,
// on v2, enables our controllers for the children of both.
func (m *cgroupManager) mkParents(b cgroupBase, instance string) (string, error) {
	parent := filepath.Join(b.dir, cgroupParentName)
	inst := filepath.Join(parent, instance)
	for _, d := range []string{parent, inst} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		if m.version == cgroupV2 {
			for _, c := range b.controllers {
				_ = writeFile(filepath.Join(d, "cgroup.subtree_control"), "+"+c)
			}
		}
	}
	// A directory that already existed may still not be ours to write.
	if unix.Access(inst, unix.W_OK) != nil {
		return "", fmt.Errorf("%s: %w", inst, fs.ErrPermission)
	}
	return inst, nil
}

func (cg *cgroup) apply(lim limits) error {
	m := cg.m
	for i, b := range m.bases {
		dir := cg.dirs[i]
		var writes [][2]string
		for _, c := range b.controllers {
			switch {
			case c == "memory" && lim.memoryMB > 0:
				bytes := strconv.FormatInt(int64(lim.memoryMB)<<20, 10)
				if m.version == cgroupV2 {
					writes = append(writes, [2]string{"memory.max", bytes})
					if exists(filepath.Join(dir, "memory.swap.max")) {
						writes = append(writes, [2]string{"memory.swap.max", "0"})
					}
				} else {
					// memsw must never be below the memory limit, so the
					// memory limit goes first (a fresh cgroup's memsw is
					// unlimited).
					writes = append(writes, [2]string{"memory.limit_in_bytes", bytes})
					if exists(filepath.Join(dir, "memory.memsw.limit_in_bytes")) {
						writes = append(writes, [2]string{"memory.memsw.limit_in_bytes", bytes})
					}
				}
			case c == "pids" && lim.pids > 0:
				writes = append(writes, [2]string{"pids.max", strconv.Itoa(lim.pids + pidsOverhead)})
			case c == "cpu" && lim.cpus > 0:
				quota := max(int64(lim.cpus*cpuPeriodUS), 1000)
				if m.version == cgroupV2 {
					writes = append(writes, [2]string{"cpu.max", fmt.Sprintf("%d %d", quota, cpuPeriodUS)})
				} else {
					writes = append(writes, [2]string{"cpu.cfs_period_us", strconv.Itoa(cpuPeriodUS)},
						[2]string{"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)})
				}
			}
		}
		for _, w := range writes {
			if err := writeFile(filepath.Join(dir, w[0]), w[1]); err != nil {
				return fmt.Errorf("set cgroup limit %s=%s: %w", w[0], w[1], err)
			}
		}
	}
	return nil
}

// procsFiles are the cgroup.procs files a process must join (v1 placement).
func (cg *cgroup) procsFiles() []string {
	out := make([]string, len(cg.dirs))
	for i, d := range cg.dirs {
		out[i] = filepath.Join(d, "cgroup.procs")
	}
	return out
}

// enterThread moves the calling OS thread, which the caller has locked,
// into the leaf in every v1 hierarchy, so that the process it forks next
// is born inside, and returns how to move the thread back. On v1 a thread
// can be moved alone; this places a sandbox race-free without the join
// script's extra shell. (v2 keeps a process's threads together: there
// children are cloned into their cgroup instead.)
//
// The thread is named as "0" (the writer itself), not by its tid: for a
// tid the kernel takes the global cgroup_threadgroup_rwsem for writing,
// and that percpu rwsem waits for an RCU grace period (6-15 ms here)
// whenever no migration happened for a grace period or two, which on a
// host whose execs are spaced out is most of them; a thread moving itself
// cannot exit or exec under the kernel's hands, so it skips that lock
// (cgroup_procs_write_start) and the move costs ~0.05 ms per hierarchy.
func (cg *cgroup) enterThread() (leave func() error, err error) {
	const self = "0"
	own, err := readOwnCgroups("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	// Home first: a thread that could not go back must not leave at all.
	var homes []*os.File
	closeHomes := func() {
		for _, f := range homes {
			f.Close()
		}
	}
	for _, b := range cg.m.bases {
		p := own[b.controllers[0]]
		rel, ok := p, true
		if b.mountRoot != "/" {
			rel, ok = strings.CutPrefix(p, b.mountRoot)
		}
		if p == "" || !ok {
			closeHomes()
			return nil, fmt.Errorf("thread's %s cgroup %q is outside the mount %s", b.controllers[0], p, b.mount)
		}
		f, err := os.OpenFile(filepath.Join(b.mount, rel, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			closeHomes()
			return nil, err
		}
		homes = append(homes, f)
	}
	leave = func() error {
		defer closeHomes()
		var errs []error
		for _, f := range homes {
			if _, err := f.WriteString(self); err != nil {
				errs = append(errs, fmt.Errorf("move thread back to %s: %w", f.Name(), err))
			}
		}
		return errors.Join(errs...)
	}
	for _, d := range cg.dirs {
		if err := writeFile(filepath.Join(d, "tasks"), self); err != nil {
			if lerr := leave(); lerr != nil {
				return nil, errors.Join(err, fmt.Errorf("%w: %w", errThreadAway, lerr))
			}
			return nil, fmt.Errorf("move thread into %s: %w", d, err)
		}
	}
	return leave, nil
}

// pids lists the processes in the leaf (union over hierarchies).
func (cg *cgroup) pids() []int {
	if cg == nil {
		return nil
	}
	var out []int
	dirs := cg.dirs
	if cg.cmds != "" {
		dirs = append([]string{cg.cmds}, dirs...)
	}
	for _, d := range dirs {
		for _, w := range readWords(filepath.Join(d, "cgroup.procs")) {
			if pid, err := strconv.Atoi(w); err == nil && !slices.Contains(out, pid) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// killAll SIGKILLs everything in the leaf until it is empty or ~2 s passed.
// On v2 cgroup.kill does it atomically (including processes forked while
// the kill runs); on v1 the pids limit bounds how many forks can race the
// loop, and the pid-namespace teardown (see run.kill) does the rest.
func (cg *cgroup) killAll() {
	if cg == nil {
		return
	}
	cg.sigkill()
	deadline := time.Now().Add(2 * time.Second)
	for {
		pids := cg.pids()
		if len(pids) == 0 || time.Now().After(deadline) {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sigkill SIGKILLs what the leaf holds now, without waiting: on v2 through
// cgroup.kill, on v1 one pass over its processes.
func (cg *cgroup) sigkill() {
	if cg == nil {
		return
	}
	if cg.m.v2Kill {
		for _, d := range cg.dirs {
			_ = writeFile(filepath.Join(d, "cgroup.kill"), "1")
		}
		return
	}
	for _, pid := range cg.pids() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// counter reads "key N" from a flat-keyed cgroup file, the first of dirs
// (the leaf's by default) that has it.
func (cg *cgroup) counter(file, key string, dirs ...string) int64 {
	if cg == nil {
		return 0
	}
	if len(dirs) == 0 {
		dirs = cg.dirs
	}
	var buf [counterFileMax]byte
	for _, d := range dirs {
		n, err := cg.files.read(filepath.Join(d, file), buf[:])
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(buf[:n]), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == key {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
	}
	return 0
}

// counterFileMax bounds the flat-keyed files counter reads (a few short
// lines each).
const counterFileMax = 512

// counterFiles keeps a cgroup's counter files open: every exec reads two
// of them before and after its command, and opening one (a long path
// walk, a seq_file made) cost more than the rest of the exec's
// bookkeeping. A read from offset 0 makes a cgroup file's text afresh.
type counterFiles struct {
	mu  sync.Mutex
	fds map[string]int // path → descriptor, -1 where the file is not
}

// read reads the file at path into buf, from its start. The lock is held
// across the read, so that close never closes a descriptor in use.
func (cf *counterFiles) read(path string, buf []byte) (int, error) {
	cf.mu.Lock()
	defer cf.mu.Unlock()
	fd, ok := cf.fds[path]
	if !ok {
		var err error
		if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				return 0, err
			}
			fd = -1
		}
		if cf.fds == nil {
			cf.fds = map[string]int{}
		}
		cf.fds[path] = fd
	}
	if fd < 0 {
		return 0, fs.ErrNotExist
	}
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], int64(n))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// close closes the files (a later read opens them again): a session
// holds them while its sandbox runs, not while it is released or gone.
func (cf *counterFiles) close() {
	cf.mu.Lock()
	defer cf.mu.Unlock()
	for _, fd := range cf.fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	cf.fds = nil
}

// oomKills is how many processes the memory limit killed.
func (cg *cgroup) oomKills() int64 {
	if cg == nil {
		return 0
	}
	if cg.m.version == cgroupV2 {
		return cg.counter("memory.events", "oom_kill")
	}
	return cg.counter("memory.oom_control", "oom_kill")
}

// pidsLimitHits is how many forks the pids limit refused.
func (cg *cgroup) pidsLimitHits() int64 {
	if cg == nil {
		return 0
	}
	n := cg.counter("pids.events", "max")
	if cg.cmds != "" {
		n += cg.counter("pids.events", "max", cg.cmds)
	}
	return n
}

// remove kills what is left and removes the leaf (and on v1 the empty
// parents). rmdir of a cgroup fails with EBUSY while exiting tasks are still
// being torn down, hence the short retry.
func (cg *cgroup) remove() {
	if cg == nil {
		return
	}
	cg.files.close()
	cg.killAll()
	if cg.cmds != "" {
		rmdirCgroup(cg.cmds)
	}
	for i, d := range cg.dirs {
		rmdirCgroup(d)
		if i < len(cg.m.bases) && cg.m.bases[i].prune {
			cg.m.pruneParents(d)
		}
	}
}

// rmdirCgroup removes an emptied cgroup, retrying up to 3 s while its
// killed tasks are still being torn down (EBUSY).
func rmdirCgroup(d string) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := syscall.Rmdir(d)
		if err == nil || errors.Is(err, syscall.ENOENT) || time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pruneParents removes the instance directory and the shared boxrt parent
// when they became empty (rmdir refuses non-empty cgroups, so this never
// disturbs a sibling).
func (m *cgroupManager) pruneParents(leaf string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	inst := filepath.Dir(leaf)
	if syscall.Rmdir(inst) == nil {
		_ = syscall.Rmdir(filepath.Dir(inst))
	}
}

// leaves lists the leaf names below <base>/boxrt/<instance> in the first
// hierarchy (all hierarchies hold the same names).
func (m *cgroupManager) leaves(instance string) []string {
	if m.version == cgroupNone || len(m.bases) == 0 {
		return nil
	}
	entries, err := os.ReadDir(filepath.Join(m.bases[0].dir, cgroupParentName, instance))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// commandsCgroup names cgroup.cmds.
const commandsCgroup = "cmds"

// existing returns a handle on a leaf left by an earlier run (StopSession,
// Adopt), without creating anything.
func (m *cgroupManager) existing(instance, leaf string) *cgroup {
	cg := &cgroup{m: m}
	for _, b := range m.bases {
		dir := filepath.Join(b.dir, cgroupParentName, instance, leaf)
		cg.dirs = append(cg.dirs, dir)
		if cmds := filepath.Join(dir, commandsCgroup); m.version == cgroupV1 && exists(cmds) {
			cg.cmds = cmds
		}
	}
	return cg
}

func readWords(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Fields(string(data))
}

// writeFile writes a cgroup control file: no create, no truncate semantics
// beyond what the kernel does, one write call.
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
