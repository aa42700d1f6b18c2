package test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fault tests: the engine restarted under an exec, the state
// directory's disk full, and boxrt killed with SIGKILL half-way through a
// session's creation. Each checks that boxrt answers typed errors, keeps
// serving, and leaves no half-made state and no orphan sandbox.

// sessionList is box_get_sessions' result, reduced to what the fault tests
// compare with the backend.
type sessionList struct {
	Sessions []struct {
		SessionID        string `json:"session_id"`
		BackendSessionID string `json:"backend_session_id"`
		State            string `json:"state"`
	} `json:"sessions"`
}

func listSessions(t *testing.T, p *Proc) sessionList {
	t.Helper()
	var l sessionList
	p.MustCall("box_get_sessions", map[string]any{}, &l)
	return l
}

// requireErrorType checks that r failed with the wire type typ.
func requireErrorType(t *testing.T, r Response, typ string, what string) *WireError {
	t.Helper()
	require.NotNil(t, r.Error, "%s: want %s, got result %s", what, typ, r.Result)
	require.Equal(t, typ, r.Error.Type(), "%s: %+v", what, r.Error)
	return r.Error
}

// --- the state directory's disk full ---------------------------------------

// smallFS makes an ext4 filesystem of mb MiB without reserved blocks on a
// loop device, mounts it on a new directory and returns that directory.
// Cleanup unmounts it (lazily: a session disk image on it may still be
// attached) and detaches the loop device.
func smallFS(t *testing.T, mb int) string {
	t.Helper()
	base := t.TempDir()
	img := filepath.Join(base, "fs.img")
	require.NoError(t, os.WriteFile(img, nil, 0o600))
	require.NoError(t, os.Truncate(img, int64(mb)<<20))
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput()
	require.NoError(t, err, "mkfs.ext4: %s", out)
	out, err = exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	require.NoError(t, err, "losetup: %s", out)
	dev := strings.TrimSpace(string(out))
	mnt := filepath.Join(base, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	out, err = exec.Command("mount", "-t", "ext4", dev, mnt).CombinedOutput()
	require.NoError(t, err, "mount: %s", out)
	return mnt
}

// fillFS fills the filesystem of dir to its last block with files under
// dir/filler and returns the function that frees them again.
func fillFS(t *testing.T, dir string) (free func()) {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	require.NoError(t, os.Mkdir(filler, 0o700))
	free = func() { require.NoError(t, os.RemoveAll(filler)) }
	chunk := make([]byte, 64<<10)
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(filler, strconv.Itoa(i)))
		if err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
		// Smaller and smaller writes take the last blocks too.
		size := len(chunk)
		for size > 0 {
			if _, err := f.Write(chunk[:size]); err != nil {
				require.ErrorIs(t, err, syscall.ENOSPC)
				size /= 2
			}
		}
		require.NoError(t, f.Close())
		if i > 4096 {
			t.Fatal("the filesystem never filled")
		}
	}
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	require.Zero(t, st.Bavail, "the filesystem is full")
	return free
}

// checkStateFiles walks a state directory: no temporary file is left and
// every JSON file decodes. Session disks and the filler are skipped.
func checkStateFiles(t *testing.T, state string) {
	t.Helper()
	err := filepath.WalkDir(state, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(state, p)
		if d.IsDir() {
			if d.Name() == "fs" || d.Name() == "lost+found" || rel == "filler" {
				return filepath.SkipDir
			}
			return nil
		}
		assert.NotContains(t, d.Name(), ".tmp", "a temporary file is left in the state directory: %s", rel)
		if strings.HasSuffix(d.Name(), ".json") {
			data, err := os.ReadFile(p)
			if assert.NoError(t, err) {
				assert.True(t, json.Valid(data), "%s does not decode: %q", rel, data)
			}
		}
		return nil
	})
	require.NoError(t, err)
}

// TestStateDirFull runs boxrt (bwrap) on an 8 MiB state directory and fills
// it: creating a session and suspending one (which writes state) answer a
// typed error naming the full disk and what to do, boxrt keeps serving the
// session it has, nothing half-made stays behind; once space is back both
// work, and a restart after kill -9 loads every state file right.
func TestStateDirFull(t *testing.T) {
	state := smallFS(t, 8)
	opts := Options{Stdio: true, StateDir: state, Config: "{" + backendConfigs["bwrap"] + "}"}
	p := Start(t, opts)
	execIn(t, p, map[string]any{"session_id": "keep", "persistent": true, "cmd": "echo kept > /workspace/f"})
	// One suspension before the disk fills, so the record's directory
	// exists: the write that fails is the record's own.
	p.MustCall("box_suspend_session", map[string]any{"session_id": "keep"}, nil)
	p.MustCall("box_resume_session", map[string]any{"session_id": "keep"}, nil)

	free := fillFS(t, state)
	r := p.Call("box_create_session", map[string]any{"session_id": "new"}, time.Minute)
	e := requireErrorType(t, r, "BoxError", "create on a full state directory")
	assert.Contains(t, e.Message, "no space left", "the error says what is wrong")
	assert.Contains(t, e.Message, state, "and where")
	assert.Contains(t, e.Message, "--state-dir", "and what to do")
	assert.Equal(t, "no_space", e.Data["reason"])
	r = p.Call("box_suspend_session", map[string]any{"session_id": "keep"}, time.Minute)
	e = requireErrorType(t, r, "BoxError", "suspend on a full state directory")
	assert.Contains(t, e.Message, "no space left")
	assert.Equal(t, "no_space", e.Data["reason"])

	require.Nil(t, p.Call("__ping", map[string]any{}, time.Minute).Error, "boxrt keeps serving")
	res := execIn(t, p, map[string]any{"session_id": "keep", "persistent": true, "cmd": "cat /workspace/f"})
	assert.Equal(t, "kept\n", res.Stdout, "the session survived the failed suspension, running")
	l := listSessions(t, p)
	require.Len(t, l.Sessions, 1, "the failed create left no session: %+v", l)
	assert.Equal(t, "running", l.Sessions[0].State)
	assert.Equal(t, 1, sandboxesLeft(t, "bwrap", state), "the failed create left no sandbox")
	checkStateFiles(t, state)

	free()
	execIn(t, p, map[string]any{"session_id": "new", "persistent": true, "cmd": "true"})
	p.MustCall("box_suspend_session", map[string]any{"session_id": "keep"}, nil)
	p.Kill()
	checkStateFiles(t, state)

	p2 := Start(t, opts)
	l = listSessions(t, p2)
	states := map[string]string{}
	for _, s := range l.Sessions {
		states[s.SessionID] = s.State
	}
	assert.Equal(t, map[string]string{"keep": "suspended", "new": "running"}, states)
	res = execIn(t, p2, map[string]any{"session_id": "keep", "persistent": true, "cmd": "cat /workspace/f"})
	assert.Equal(t, "kept\n", res.Stdout)
	p2.MustCall("box_shutdown", map[string]any{}, nil)
	assert.Equal(t, 0, sandboxesLeft(t, "bwrap", state))
}

// --- kill -9 during a session's creation -----------------------------------

// killWhen kills p with SIGKILL as soon as seen returns true (polled every
// half millisecond), and fails the test if p answered its pending request
// first or seen never came true.
func killWhen(t *testing.T, p *Proc, seen func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !seen() {
		select {
		case line := <-p.lines:
			t.Fatalf("the create finished before boxrt could be killed: %s", line)
		default:
		}
		require.True(t, time.Now().Before(deadline), "the creation never began")
		time.Sleep(500 * time.Microsecond)
	}
	p.Kill()
}

// sendCreate sends box_create_session without waiting for its answer.
func sendCreate(t *testing.T, p *Proc, id string) {
	t.Helper()
	req, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "half-made", "method": "box_create_session",
		"params": map[string]any{"session_id": id}})
	require.NoError(t, err)
	p.Send(append(req, '\n'))
}

var bwrapSessionDir = regexp.MustCompile(`-[0-9a-f]{8}$`)

// bwrapLeftovers lists what bwrap keeps of sessions outside the listed
// ones: session directories, stage directories and mounts.
func bwrapLeftovers(t *testing.T, state string, listed sessionList) []string {
	t.Helper()
	inst := instanceIDOf(t, state)
	known := map[string]bool{}
	for _, s := range listed.Sessions {
		known[s.BackendSessionID] = true
	}
	var left []string
	for _, dir := range []string{filepath.Join(state, "bwrap", inst), filepath.Join("/run/boxrt/bwrap", inst)} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			require.NoError(t, err)
		}
		for _, e := range entries {
			if bwrapSessionDir.MatchString(e.Name()) && !known[e.Name()] {
				left = append(left, filepath.Join(dir, e.Name()))
			}
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	stage := filepath.Join("/run/boxrt/bwrap", inst) + "/"
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], stage) {
			key, _, _ := strings.Cut(strings.TrimPrefix(f[4], stage), "/")
			if !known[key] {
				left = append(left, "mount "+f[4])
			}
		}
	}
	return left
}

// processesUsing lists the processes whose command line names path, but
// for the given ones.
func processesUsing(t *testing.T, path string, except ...int) []string {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var out []string
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || slices.Contains(except, pid) {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), path) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return out
}

// dockerLeftovers lists this installation's containers and workspace
// volumes that belong to no listed session.
func dockerLeftovers(t *testing.T, dockerArgs []string, state string, listed sessionList) []string {
	t.Helper()
	label := "label=boxrt.instance=" + instanceIDOf(t, state)
	known := map[string]bool{}
	for _, s := range listed.Sessions {
		known[s.BackendSessionID] = true
	}
	var left []string
	out, err := exec.Command("docker", append(dockerArgs, "ps", "-a", "--filter", label, "--format", "{{.Names}} {{.State}}")...).Output()
	require.NoError(t, err)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, _, _ := strings.Cut(line, " "); name != "" && !known[name] {
			left = append(left, "container "+line)
		}
	}
	out, err = exec.Command("docker", append(dockerArgs, "volume", "ls", "-q", "--filter", label)...).Output()
	require.NoError(t, err)
	for _, v := range strings.Fields(string(out)) {
		if !known[strings.TrimPrefix(v, "boxrt-ws-")] {
			left = append(left, "volume "+v)
		}
	}
	return left
}

// TestKill9DuringCreate kills boxrt with SIGKILL while it creates a
// session — bwrap: as soon as the session's directory exists; docker: as
// soon as the engine reports the container created — and restarts it on
// the same state directory: every session it lists is one the backend has,
// nothing the killed process half-made is left (no container, volume,
// directory, mount, disk template or process), and the session id works
// again.
func TestKill9DuringCreate(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			state := t.TempDir()
			removeInstanceContainers(t, state)
			opts := Options{Stdio: true, StateDir: state, Config: "{" + backendConfigs[backend] + "}"}
			p := Start(t, opts)
			inst := instanceIDOf(t, state)
			if backend == "bwrap" {
				root := filepath.Join(state, "bwrap", inst)
				sendCreate(t, p, "half")
				killWhen(t, p, func() bool {
					entries, _ := os.ReadDir(root)
					for _, e := range entries {
						if strings.HasPrefix(e.Name(), "half-") {
							return true
						}
					}
					return false
				})
			} else {
				// --since replays from before the create: no event is
				// missed while the command connects.
				events := exec.Command("docker", "events", "--since", strconv.FormatInt(time.Now().Unix()-1, 10),
					"--filter", "type=container", "--filter", "event=create", "--filter", "label=boxrt.instance="+inst,
					"--format", "{{.Actor.Attributes.name}}")
				stdout, err := events.StdoutPipe()
				require.NoError(t, err)
				require.NoError(t, events.Start())
				t.Cleanup(func() { _ = events.Process.Kill(); _ = events.Wait() })
				created := make(chan string, 1)
				go func() {
					sc := bufio.NewScanner(stdout)
					if sc.Scan() {
						created <- sc.Text()
					}
				}()
				sendCreate(t, p, "half")
				killWhen(t, p, func() bool { return len(created) > 0 })
			}
			t.Logf("killed during the create; %s", describeLeftovers(t, backend, state))
			// The docker disks' templates: the killed boxrt's made one for
			// the create's disks, and the next start removes it.
			templates := filepath.Join(state, "docker", inst, ".templates", "*")
			if backend == "docker" {
				left, _ := filepath.Glob(templates)
				require.NotEmpty(t, left, "the killed boxrt made its disk templates")
			}

			p2 := Start(t, opts)
			l := listSessions(t, p2)
			left, _ := filepath.Glob(templates)
			assert.Empty(t, left, "the restarted boxrt removed the killed one's disk templates")
			for _, s := range l.Sessions {
				assert.True(t, backendHas(t, backend, state, s.BackendSessionID),
					"listed session %s (%s) is not in the backend", s.SessionID, s.BackendSessionID)
			}
			assert.Empty(t, leftovers(t, backend, state, l), "the restarted boxrt left what the killed one half-made")
			assert.Empty(t, processesUsing(t, state, p2.cmd.Process.Pid), "no process of the killed boxrt's sandboxes is left")

			execIn(t, p2, map[string]any{"session_id": "half", "cmd": "echo whole > /workspace/f"})
			res := execIn(t, p2, map[string]any{"session_id": "half", "cmd": "cat /workspace/f"})
			assert.Equal(t, "whole\n", res.Stdout)
			p2.MustCall("box_shutdown", map[string]any{}, nil)
			assert.Empty(t, leftovers(t, backend, state, sessionList{}), "box_shutdown leaves nothing behind")
		})
	}
}

func leftovers(t *testing.T, backend, state string, l sessionList) []string {
	if backend == "bwrap" {
		return bwrapLeftovers(t, state, l)
	}
	return dockerLeftovers(t, nil, state, l)
}

func describeLeftovers(t *testing.T, backend, state string) string {
	return fmt.Sprintf("before the restart: %v", leftovers(t, backend, state, sessionList{}))
}

// backendHas reports whether the backend has the sandbox of a session.
func backendHas(t *testing.T, backend, state, backendSessionID string) bool {
	if backend == "bwrap" {
		_, err := os.Stat(filepath.Join(state, "bwrap", instanceIDOf(t, state), backendSessionID, "session.json"))
		return err == nil
	}
	return exec.Command("docker", "inspect", "--type", "container", backendSessionID).Run() == nil
}

// --- the engine restarted during an exec -----------------------------------

// privateDockerd is a Docker engine of the test's own (the machine's is
// shared): its own socket, data and exec roots and network namespace, no
// bridge, no iptables.
type privateDockerd struct {
	t    *testing.T
	dir  string
	host string // DOCKER_HOST
	cmd  *exec.Cmd
}

// startPrivateDockerd starts an engine and loads the test image into it
// from the machine's engine. Cleanup removes its containers, stops it and
// whatever its containerd left, unmounts what it mounted and deletes its
// directories.
func startPrivateDockerd(t *testing.T) *privateDockerd {
	t.Helper()
	// Short: containerd's socket path lives under it.
	dir, err := os.MkdirTemp("/tmp", "bxd-")
	require.NoError(t, err)
	d := &privateDockerd{t: t, dir: dir, host: "unix://" + filepath.Join(dir, "d.sock")}
	t.Cleanup(d.cleanup)
	d.start()
	load := exec.Command("sh", "-c", `docker save "$1" | docker -H "$2" load`, "sh", "boxrt-test:busybox", d.host)
	out, err := load.CombinedOutput()
	require.NoError(t, err, "loading the test image: %s", out)
	return d
}

func (d *privateDockerd) docker(args ...string) *exec.Cmd {
	return exec.Command("docker", append([]string{"-H", d.host}, args...)...)
}

func (d *privateDockerd) start() {
	d.t.Helper()
	log, err := os.OpenFile(filepath.Join(d.dir, "dockerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(d.t, err)
	defer log.Close()
	// A network namespace of its own: with --bridge=none dockerd deletes
	// the host's docker0 at start, which the machine's engine needs.
	d.cmd = exec.Command("unshare", "--net", "dockerd", "--host", d.host, "--data-root", filepath.Join(d.dir, "root"),
		"--exec-root", filepath.Join(d.dir, "x"), "--pidfile", filepath.Join(d.dir, "d.pid"),
		"--bridge=none", "--iptables=false", "--ip-masq=false")
	d.cmd.Stdout, d.cmd.Stderr = log, log
	require.NoError(d.t, d.cmd.Start())
	deadline := time.Now().Add(30 * time.Second)
	for d.docker("version").Run() != nil {
		if time.Now().After(deadline) {
			logText, _ := os.ReadFile(filepath.Join(d.dir, "dockerd.log"))
			d.t.Fatalf("the private dockerd did not answer within 30 s:\n%s", lastLines(string(logText), 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill ends the engine as a crash does: SIGKILL to dockerd and to the
// containerd it started (which would otherwise linger for a moment and make
// the next dockerd wait for it in vain); the containers' shims stay.
func (d *privateDockerd) kill() {
	d.t.Helper()
	pidFile := filepath.Join(d.dir, "x", "containerd", "containerd.pid")
	data, err := os.ReadFile(pidFile)
	require.NoError(d.t, err)
	containerd, err := strconv.Atoi(strings.TrimSpace(string(data)))
	require.NoError(d.t, err)
	require.NoError(d.t, d.cmd.Process.Kill())
	_ = d.cmd.Wait()
	require.NoError(d.t, syscall.Kill(containerd, syscall.SIGKILL))
	require.Eventually(d.t, func() bool { return syscall.Kill(containerd, 0) != nil }, 10*time.Second, 10*time.Millisecond,
		"containerd %d did not exit", containerd)
}

// pidsUnder lists the processes whose command line names the engine's
// directory (its containerd, the containers' shims).
func (d *privateDockerd) pidsUnder() []int {
	var pids []int
	for _, line := range processesUsing(d.t, d.dir) {
		pid, _, _ := strings.Cut(line, ":")
		if n, err := strconv.Atoi(pid); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// unmountUnder detaches everything mounted at or below dir, deepest first.
func unmountUnder(dir string) {
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	var under []string
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			under = append(under, f[4])
		}
	}
	for i := len(under) - 1; i >= 0; i-- {
		_ = syscall.Unmount(under[i], syscall.MNT_DETACH)
	}
}

func (d *privateDockerd) cleanup() {
	if d.cmd != nil && d.cmd.ProcessState == nil {
		if ids, err := d.docker("ps", "-aq").Output(); err == nil && len(strings.Fields(string(ids))) > 0 {
			_ = d.docker(append([]string{"rm", "-f", "-v"}, strings.Fields(string(ids))...)...).Run()
		}
		_ = d.docker("volume", "prune", "-f").Run()
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = d.cmd.Process.Kill()
			<-done
		}
	}
	for _, pid := range d.pidsUnder() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	unmountUnder(d.dir)
	if err := os.RemoveAll(d.dir); err != nil {
		d.t.Errorf("removing the private dockerd's directory: %v", err)
	}
}

// TestDockerdRestartDuringExec kills a private engine while a command runs
// in a session and starts it again (without live-restore, as Debian ships
// it, the restart stops every container). The session's agent needs no
// engine: the running exec completes, and while the engine is down boxrt
// keeps serving, keeps the session and runs its commands; once the engine
// is back (and has stopped the container) the session works again with
// its files, and nothing is left behind.
func TestDockerdRestartDuringExec(t *testing.T) {
	state := t.TempDir()
	// A session's quota disk is mounted in the state directory; when the
	// test fails before the sessions are removed, boxrt leaves it.
	t.Cleanup(func() { unmountUnder(state) })
	d := startPrivateDockerd(t)
	p := Start(t, Options{Stdio: true, StateDir: state, Env: []string{"DOCKER_HOST=" + d.host},
		Config: "{" + backendConfigs["docker"] + "}"})
	t.Cleanup(func() {
		if t.Failed() {
			logText, _ := os.ReadFile(filepath.Join(d.dir, "dockerd.log"))
			t.Logf("private dockerd log:\n%s", lastLines(string(logText), 40))
		}
	})
	sid := map[string]any{"session_id": "engine", "persistent": true}
	execIn(t, p, with(sid, "cmd", "echo kept > /workspace/f"))
	var info struct {
		BackendSessionID string `json:"backend_session_id"`
	}
	p.MustCall("box_get_session", map[string]any{"session_id": "engine"}, &info)

	running := make(chan Response, 1)
	go func() {
		// Call's timeout would Fatal off the test goroutine: a generous
		// one, and the result is checked below.
		running <- p.Call("box_exec", with(sid, "cmd", "sleep 5; echo late"), 5*time.Minute)
	}()
	require.Eventually(t, func() bool {
		out, _ := d.docker("exec", info.BackendSessionID, "ps", "-o", "args").Output()
		return strings.Contains(string(out), "sleep 5")
	}, 30*time.Second, 50*time.Millisecond, "the command never started")
	d.kill()

	var r Response
	select {
	case r = <-running:
	case <-time.After(time.Minute):
		t.Fatal("the exec under the killed engine did not answer within a minute")
	}
	// The session's agent runs the command without the engine: the
	// container outlives dockerd's death, and so does the command.
	requireEngineFreeResult(t, r, "late\n", "the exec whose engine died")

	require.Nil(t, p.Call("__ping", map[string]any{}, time.Minute).Error, "boxrt keeps serving")
	r = p.Call("box_exec", with(sid, "cmd", "cat /workspace/f"), time.Minute)
	requireEngineFreeResult(t, r, "kept\n", "an exec while the engine is down")
	l := listSessions(t, p)
	require.Len(t, l.Sessions, 1, "the session is kept while the engine is down")
	assert.Equal(t, info.BackendSessionID, l.Sessions[0].BackendSessionID)

	d.start()
	r = p.Call("box_exec", with(sid, "cmd", "cat /workspace/f"), 2*time.Minute)
	if r.Error != nil {
		// Reported gone is the other honest answer.
		requireErrorType(t, r, "BoxSessionNotFoundError", "the first exec after the engine came back")
	} else {
		var res ExecResult
		require.NoError(t, json.Unmarshal(r.Result, &res))
		assert.Equal(t, "kept\n", res.Stdout, "the session works again with its files, not silently recreated empty")
		l = listSessions(t, p)
		assert.Len(t, l.Sessions, 1)
	}
	p.MustCall("box_shutdown", map[string]any{}, nil)
	assert.Empty(t, dockerLeftovers(t, []string{"-H", d.host}, state, sessionList{}), "nothing is left in the engine")
}

// requireEngineFreeResult: r is a completed exec that printed stdout.
func requireEngineFreeResult(t *testing.T, r Response, stdout, what string) {
	t.Helper()
	require.Nil(t, r.Error, "%s: want the command's result, not an error", what)
	var res ExecResult
	require.NoError(t, json.Unmarshal(r.Result, &res))
	assert.Equal(t, "completed", res.Status, what)
	assert.Equal(t, stdout, res.Stdout, what)
}
