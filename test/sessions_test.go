package test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// ExecResult mirrors box_exec's result.
type ExecResult struct {
	SessionID       string `json:"session_id"`
	BackendName     string `json:"backend_name"`
	Status          string `json:"status"`
	ExitCode        *int   `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	DurationMS      int64  `json:"duration_ms"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StdoutBytes     int64  `json:"stdout_bytes"`
}

func execIn(t *testing.T, p *Proc, params map[string]any) ExecResult {
	t.Helper()
	var res ExecResult
	p.MustCall("box_exec", params, &res)
	return res
}

func backendProc(t *testing.T, backend, extra string) *Proc {
	t.Helper()
	cfg := "{" + backendConfigs[backend]
	if extra != "" {
		cfg += "," + extra
	}
	return Start(t, Options{Stdio: true, Config: cfg + "}"})
}

// hostListener accepts TCP connections on an address a sandbox with
// network would reach: all interfaces (the docker bridge gateway included).
func hostListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	return l.Addr().String()
}

// hostIP is an address of this machine other sandboxes can route to. For
// bwrap that is not loopback (a network: on sandbox has its own namespace
// without the host's loopback) but the default route's interface address.
func hostIP(t *testing.T, backend string) string {
	if backend == "bwrap" {
		data, err := os.ReadFile("/proc/thread-self/net/route") // this thread's: a test that wedged the main thread in a namespace of its own moved /proc/net with it
		require.NoError(t, err)
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[1] == "00000000" {
				iface, err := net.InterfaceByName(f[0])
				require.NoError(t, err)
				addrs, err := iface.Addrs()
				require.NoError(t, err)
				for _, a := range addrs {
					if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
						return ipn.IP.String()
					}
				}
			}
		}
		t.Fatal("no default route with an IPv4 address on this machine")
	}
	out, err := exec.Command("docker", "network", "inspect", "bridge", "-f", "{{(index .IPAM.Config 0).Gateway}}").Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

func TestExecSemantics(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		p := backendProc(t, backend, "")
		sid := "exec-" + backend
		t.Cleanup(func() { p.Call("box_delete_session", map[string]any{"session_id": sid}, time.Minute) })

		t.Run("echo", func(t *testing.T) {
			r := execIn(t, p, map[string]any{"session_id": sid, "cmd": "echo hello; echo oops >&2; exit 4"})
			assert.Equal(t, "completed", r.Status)
			assert.Equal(t, 4, *r.ExitCode)
			assert.Equal(t, "hello\n", r.Stdout, "output is not stripped")
			assert.Equal(t, wireBackend(backend), r.BackendName)
		})
		t.Run("a command longer than an agent frame", func(t *testing.T) {
			// 100,000 bytes: over the agent's 64 KiB frames, under the
			// kernel's 128 KiB for one argument.
			r := execIn(t, p, map[string]any{"session_id": sid, "cmd": "printf '%s' " + strings.Repeat("a", 100_000) + " | wc -c"})
			assert.Equal(t, "completed", r.Status)
			assert.Equal(t, "100000", strings.TrimSpace(r.Stdout))
			resp := p.Call("box_exec", map[string]any{"session_id": sid, "cmd": "true #" + strings.Repeat("a", 128<<10)}, time.Minute)
			require.NotNil(t, resp.Error, "a cmd over the kernel's limit for one argument")
			assert.Contains(t, resp.Error.Message, "BoxValidationError")
			assert.Contains(t, resp.Error.Message, "at most 131071")
		})
		t.Run("files persist across execs", func(t *testing.T) {
			execIn(t, p, map[string]any{"session_id": sid, "cmd": "echo kept > /workspace/f.txt"})
			r := execIn(t, p, map[string]any{"session_id": sid, "cmd": "cat f.txt"})
			assert.Equal(t, "kept\n", r.Stdout)
		})
		t.Run("timeout kills the tree and keeps the session", func(t *testing.T) {
			start := time.Now()
			r := execIn(t, p, map[string]any{"session_id": sid, "cmd": "sleep 61 & sleep 62; echo never", "timeout_sec": 2})
			assert.Equal(t, "timed_out", r.Status)
			assert.Nil(t, r.ExitCode)
			assert.Less(t, time.Since(start), 5*time.Second)
			r = execIn(t, p, map[string]any{"session_id": sid, "cmd": "cat f.txt; ps 2>/dev/null | grep -c 'sleep 6[12]' || true"})
			assert.Equal(t, "kept\n0\n", r.Stdout, "the session survives, its files too, and no sleep is left")
		})
		t.Run("5 MiB of output is bounded with head and tail", func(t *testing.T) {
			r := execIn(t, p, map[string]any{"session_id": sid, "cmd": "echo FIRST; head -c 5242880 /dev/zero | tr '\\0' x; echo; echo LAST"})
			assert.True(t, r.StdoutTruncated)
			assert.Equal(t, int64(5242880+len("FIRST\n")+1+len("LAST\n")), r.StdoutBytes)
			assert.True(t, strings.HasPrefix(r.Stdout, "FIRST\nxxx"))
			assert.True(t, strings.HasSuffix(r.Stdout, "xxx\nLAST\n"))
			assert.Contains(t, r.Stdout, "bytes omitted")
			assert.LessOrEqual(t, len(r.Stdout), 1<<20+200)
		})
		t.Run("writes outside workspace and tmp fail", func(t *testing.T) {
			r := execIn(t, p, map[string]any{"session_id": sid, "cmd": "touch /etc/x 2>/dev/null && echo etc; touch /usr/x 2>/dev/null && echo usr; touch /tmp/x && echo tmp; touch /workspace/x && echo ws"})
			assert.Equal(t, "tmp\nws\n", r.Stdout)
		})
		t.Run("network off", func(t *testing.T) {
			addr := hostListener(t)
			_, port, _ := net.SplitHostPort(addr)
			ip := hostIP(t, backend)
			cmd := fmt.Sprintf("busybox nc -w 2 %s %s </dev/null | grep -q hello && echo connected || echo refused", ip, port)
			r := execIn(t, p, map[string]any{"session_id": sid, "cmd": cmd})
			assert.Equal(t, "refused\n", r.Stdout)
			if backend == "docker-runsc" {
				// gVisor's netstack would bypass the egress proxy.
				resp := p.Call("box_exec", map[string]any{"session_id": sid + "-on", "network": "on", "cmd": cmd}, time.Minute)
				require.NotNil(t, resp.Error)
				assert.Equal(t, "BoxValidationError", resp.Error.Type())
				return
			}
			// "on" refuses the host's own addresses (the egress proxy);
			// a rule naming the address lets the same probe through.
			r = execIn(t, p, map[string]any{"session_id": sid + "-on", "network": "on", "cmd": cmd})
			assert.Equal(t, "refused\n", r.Stdout, "network on reached the host's address")
			r = execIn(t, p, map[string]any{"session_id": sid + "-net", "network": map[string]any{"allow": []string{ip + ":" + port}}, "cmd": cmd})
			assert.Equal(t, "connected\n", r.Stdout, "the same probe works with a rule naming the address")
			for _, s := range []string{sid + "-on", sid + "-net"} {
				p.MustCall("box_delete_session", map[string]any{"session_id": s}, nil)
			}
		})
		t.Run("memory hog is killed at the limit", func(t *testing.T) {
			r := execIn(t, p, map[string]any{"session_id": sid + "-mem", "memory_mb": 64, "timeout_sec": 60,
				"cmd": "x=$(head -c 209715200 /dev/zero | tr '\\0' x); echo survived ${#x}"})
			assert.NotEqual(t, "survived 209715200\n", r.Stdout, "%+v", r)
			r = execIn(t, p, map[string]any{"session_id": sid + "-mem", "memory_mb": 64, "cmd": "x=$(head -c 1048576 /dev/zero | tr '\\0' x); echo ${#x}"})
			assert.Equal(t, "1048576\n", r.Stdout, "small allocations work and the session is usable")
			p.MustCall("box_delete_session", map[string]any{"session_id": sid + "-mem"}, nil)
		})
		t.Run("fork bomb is capped by pids", func(t *testing.T) { checkPidsLimit(t, p, backend, sid+"-pids") })
	})
}

// TestAgentThreadsOnManyCPUs checks the agent keeps within the thread
// allowance the backends add to a sandbox's pids limit however many CPUs
// the runtime sees (GOMAXPROCS=64 stands in for a large host): the
// binary's initialization would otherwise run the collector on all of them.
func TestAgentThreadsOnManyCPUs(t *testing.T) {
	cmd := exec.Command(os.Getenv("BOXRT_AGENT_BINARY"), "agent", "--connect", filepath.Join(t.TempDir(), "none.sock"))
	cmd.Env = append(os.Environ(), "GOMAXPROCS=64")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// It keeps re-dialing; by then its spares are made.
	time.Sleep(1500 * time.Millisecond)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	require.NoError(t, err)
	var threads int
	for _, line := range strings.Split(string(status), "\n") {
		if n, ok := strings.CutPrefix(line, "Threads:"); ok {
			_, err = fmt.Sscan(n, &threads)
			require.NoError(t, err)
		}
	}
	t.Logf("agent threads with GOMAXPROCS=64: %d", threads)
	assert.Positive(t, threads)
	assert.LessOrEqual(t, threads, sandboxagent.MaxThreads)
}

// checkPidsLimit runs a fork bomb and a fill of sleepers in session sid
// under pids_limit 32 and checks what the limit let through.
func checkPidsLimit(t *testing.T, p *Proc, backend, sid string) {
	if backend == "docker-runsc" {
		// gVisor's processes are not host processes: the host-side
		// count below sees none. The bomb must end in bounded time
		// (the sandbox may end with it; the escape tests in
		// backends/backendtest count what the limit let through).
		start := time.Now()
		r := p.Call("box_exec", map[string]any{"session_id": sid, "pids_limit": 32, "timeout_sec": 4,
			"cmd": "bomb() { bomb | bomb & }; bomb; sleep 6"}, 2*time.Minute)
		t.Logf("fork bomb on gVisor: %v after %v", r.Error, time.Since(start))
		assert.Less(t, time.Since(start), time.Minute)
		p.Call("box_delete_session", map[string]any{"session_id": sid}, time.Minute)
		return
	}
	// The bomb's tree collapses as soon as its forks fail, faster
	// than a host-side sample can reliably catch (CI saw none), so
	// its stderr shows the limit refused forks, and a fill that
	// stays (sleepers) is counted in the sandbox's pid namespace.
	bomb := execIn(t, p, map[string]any{"session_id": sid, "pids_limit": 32, "timeout_sec": 4,
		"cmd": "bomb() { bomb | bomb & }; bomb; sleep 6"})
	assert.Contains(t, strings.ToLower(bomb.Stderr), "fork", "the limit refused the bomb's forks: %+v", bomb)
	// The shell stops at its first refused fork; the sleepers stay.
	fill := execIn(t, p, map[string]any{"session_id": sid, "pids_limit": 32,
		"cmd": "i=0; while [ $i -lt 64 ]; do sleep " + pidsMarker + " >/dev/null 2>&1 & i=$((i+1)); done"})
	assert.Contains(t, strings.ToLower(fill.Stderr), "fork", "the limit refused the 64 sleepers: %+v", fill)
	// Besides the commands, the sandbox's pid namespace holds the
	// session agent (bwrap: and its init).
	commands := pidNSPopulation(t, "sleep\x00"+pidsMarker) - 1
	if backend == "bwrap" {
		commands--
	}
	t.Logf("commands in the sandbox once full: %d", commands)
	// The agent's threads come on top of pids_limit, not out of it;
	// the commands may also take what the agent leaves unused of its
	// allowance (10 threads, 9 made before any command: operations.md).
	assert.GreaterOrEqual(t, commands, 32, "the commands could use all of pids_limit")
	assert.LessOrEqual(t, commands, 32+2, "no more than pids_limit and the agent's unused allowance")
	p.MustCall("box_delete_session", map[string]any{"session_id": sid}, nil)
}

func TestSessionMethods(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		p := backendProc(t, backend, `"limits":{"session_ttl_sec":300}`)
		var info map[string]any
		p.MustCall("box_create_session", map[string]any{"session_id": "m1", "memory_mb": 128}, &info)
		assert.Equal(t, "m1", info["session_id"])
		assert.Equal(t, wireBackend(backend), info["backend_name"])
		assert.Nil(t, info["host_path"])
		assert.NotEmpty(t, info["backend_session_id"])

		var list struct {
			Sessions []map[string]any `json:"sessions"`
		}
		p.MustCall("box_get_sessions", map[string]any{}, &list)
		require.Len(t, list.Sessions, 1)

		r := p.Call("box_exec", map[string]any{"session_id": "m1", "cmd": "true"}, time.Minute)
		require.NotNil(t, r.Error)
		assert.Equal(t, "memory_mb", r.Error.Data["field"], "the default memory differs from the session's")
		assert.Contains(t, r.Error.Message, "memory_mb=128")

		var del map[string]string
		p.MustCall("box_delete_session", map[string]any{"session_id": "m1"}, &del)
		assert.Equal(t, "m1", del["deleted"])
		if strings.HasPrefix(backend, "docker") {
			assert.Empty(t, managedContainers(t, info["backend_session_id"].(string)), "delete removes the container")
		} else {
			_, err := os.Stat(filepath.Join(p.State, "bwrap"))
			require.NoError(t, err)
			entries, _ := filepath.Glob(filepath.Join(p.State, "bwrap", "*", "m1-*"))
			assert.Empty(t, entries, "delete removes the session directory")
		}
	})
}

func TestTTLReaping(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		p := backendProc(t, backend, `"limits":{"session_ttl_sec":1}`)
		p.MustCall("box_create_session", map[string]any{"session_id": "short"}, nil)
		p.MustCall("box_create_session", map[string]any{"session_id": "keep", "persistent": true}, nil)
		require.Eventually(t, func() bool {
			return p.Call("box_get_session", map[string]any{"session_id": "short"}, time.Minute).Error != nil
		}, 15*time.Second, 200*time.Millisecond)
		require.Nil(t, p.Call("box_get_session", map[string]any{"session_id": "keep"}, time.Minute).Error, "persistent sessions are spared")
		var st map[string]any
		p.MustCall("box_status", map[string]any{}, &st)
		assert.Equal(t, float64(1), st["total_reaped"])
		p.MustCall("box_delete_session", map[string]any{"session_id": "keep"}, nil)
	})
}

func TestHostPathPolicy(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "escape")))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "ok"), 0o755))
	p := backendProc(t, "bwrap", fmt.Sprintf(`"local":{"allowed_mount_roots":[%q]}`, root))
	tests := []struct {
		name   string
		params map[string]any
		ok     bool
	}{
		{"inside the allow-list", map[string]any{"host_path": filepath.Join(root, "ok")}, true},
		{"outside the allow-list", map[string]any{"host_path": outside}, false},
		{"symlink escaping the allow-list", map[string]any{"host_path": filepath.Join(root, "escape")}, false},
		{"dot-dot escape", map[string]any{"host_path": root + "/ok/../../" + filepath.Base(outside)}, false},
		{"system directory", map[string]any{"host_path": "/etc"}, false},
		{"root", map[string]any{"host_path": "/"}, false},
		{"docker socket", map[string]any{"host_path": "/var/run/docker.sock"}, false},
		{"extra mount outside", map[string]any{"extra_mounts": []map[string]any{{"host_path": outside, "mount_path": "/data", "mode": "ro"}}}, false},
		{"extra mount symlink escape", map[string]any{"extra_mounts": []map[string]any{{"host_path": filepath.Join(root, "escape"), "mount_path": "/data"}}}, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.params["session_id"] = fmt.Sprintf("hp%d", i)
			tc.params["cmd"] = "ls /workspace"
			r := p.Call("box_exec", tc.params, time.Minute)
			if tc.ok {
				require.Nil(t, r.Error)
				return
			}
			require.NotNil(t, r.Error)
			assert.Equal(t, "BoxValidationError", r.Error.Type())
			assert.NotEmpty(t, r.Error.Data["field"])
			assert.Contains(t, r.Error.Message, "host_path")
		})
	}
}

// pidsMarker is the sleep duration the pids test's sleepers run with, so
// that the host finds them (and their sandbox) among every other process.
const pidsMarker = "3031"

// pidNSPopulation counts the processes in the pid namespace of the first
// host process whose command line is cmdline (NUL-separated, as in
// /proc/PID/cmdline, without the final NUL).
func pidNSPopulation(t *testing.T, cmdline string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	nsOf := map[string]string{}
	target := ""
	for _, e := range entries {
		if c := e.Name()[0]; c < '0' || c > '9' {
			continue
		}
		ns, err := os.Readlink("/proc/" + e.Name() + "/ns/pid")
		if err != nil {
			continue
		}
		nsOf[e.Name()] = ns
		if cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && target == "" && strings.TrimSuffix(string(cmd), "\x00") == cmdline {
			target = ns
		}
	}
	require.NotEmpty(t, target, "no process runs %q", cmdline)
	n := 0
	for _, ns := range nsOf {
		if ns == target {
			n++
		}
	}
	return n
}

// removeInstanceContainers deletes, when the test ends, every container and
// workspace volume of the installation whose state dir is given, so a failing test leaves no
// sandbox behind.
func removeInstanceContainers(t *testing.T, stateDir string) {
	t.Cleanup(func() {
		id, err := os.ReadFile(filepath.Join(stateDir, "instance-id"))
		if err != nil {
			return
		}
		label := "boxrt.instance=" + strings.TrimSpace(string(id))
		if ids := managedContainers(t, label); len(ids) > 0 {
			_ = exec.Command("docker", append([]string{"rm", "-f", "-v"}, ids...)...).Run()
		}
		out, _ := exec.Command("docker", "volume", "ls", "-q", "--filter", "label="+label).Output()
		if vols := strings.Fields(string(out)); len(vols) > 0 {
			_ = exec.Command("docker", append([]string{"volume", "rm", "-f"}, vols...)...).Run()
		}
	})
}

// managedContainers lists containers (any state) with the given name
// filter that carry boxrt's label.
func managedContainers(t *testing.T, nameOrLabel string) []string {
	t.Helper()
	args := []string{"ps", "-a", "-q", "--filter", "label=boxrt.managed=true"}
	if strings.Contains(nameOrLabel, "=") {
		args = append(args, "--filter", "label="+nameOrLabel)
	} else if nameOrLabel != "" {
		args = append(args, "--filter", "name="+nameOrLabel)
	}
	out, err := exec.Command("docker", args...).Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

func TestDockerReadoption(t *testing.T) {
	state := t.TempDir()
	removeInstanceContainers(t, state)
	cfg := "{" + backendConfigs["docker"] + "}"
	p := Start(t, Options{Stdio: true, Config: cfg, StateDir: state})
	var st struct {
		InstanceID string `json:"instance_id"`
	}
	p.MustCall("box_status", map[string]any{}, &st)
	execIn(t, p, map[string]any{"session_id": "adopt", "cmd": "echo survived > /workspace/mark"})
	p.Kill() // kill -9: no cleanup runs

	p2 := Start(t, Options{Stdio: true, Config: cfg, StateDir: state})
	var info map[string]any
	p2.MustCall("box_get_session", map[string]any{"session_id": "adopt"}, &info)
	r := execIn(t, p2, map[string]any{"session_id": "adopt", "cmd": "cat /workspace/mark"})
	assert.Equal(t, "survived\n", r.Stdout)

	// Another installation's containers are left alone.
	other := Start(t, Options{Stdio: true, Config: cfg})
	var otherList struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	other.MustCall("box_get_sessions", map[string]any{}, &otherList)
	assert.Empty(t, otherList.Sessions)
	other.Stop()
	assert.NotEmpty(t, managedContainers(t, "boxrt.instance="+st.InstanceID))

	p2.MustCall("box_shutdown", map[string]any{}, nil)
	assert.Empty(t, managedContainers(t, "boxrt.instance="+st.InstanceID), "box_shutdown leaves no container behind")
	require.Nil(t, p2.Call("__ping", map[string]any{}, time.Minute).Error, "box_shutdown keeps the runtime serving")
}

func TestImageDirectoryAllowList(t *testing.T) {
	root := t.TempDir()
	p := backendProc(t, "bwrap", fmt.Sprintf(`"local":{"allowed_mount_roots":[%q]}`, root))
	for _, image := range []string{"/etc", "/root", t.TempDir()} {
		r := p.Call("box_exec", map[string]any{"session_id": "img", "image": image, "cmd": "true"}, time.Minute)
		require.NotNil(t, r.Error, image)
		assert.Equal(t, "image", r.Error.Data["field"], image)
	}
}

// TestDockerSandboxGone: a container removed behind boxrt's back is
// recreated by the next exec, which then succeeds.
func TestDockerSandboxGone(t *testing.T) {
	state := t.TempDir()
	removeInstanceContainers(t, state)
	p := Start(t, Options{Stdio: true, StateDir: state, Config: "{" + backendConfigs["docker"] + "}"})
	var info map[string]any
	p.MustCall("box_create_session", map[string]any{"session_id": "gone"}, &info)
	name := info["backend_session_id"].(string)
	require.NoError(t, exec.Command("docker", "rm", "-f", name).Run())
	r := execIn(t, p, map[string]any{"session_id": "gone", "cmd": "echo back"})
	assert.Equal(t, "back\n", r.Stdout)
	p.MustCall("box_get_session", map[string]any{"session_id": "gone"}, &info)
	assert.NotEqual(t, name, info["backend_session_id"])
	p.MustCall("box_delete_session", map[string]any{"session_id": "gone"}, nil)
}
