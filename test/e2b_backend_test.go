package test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/backends/e2b"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// e2bEndpoint starts a boxrt serving E2B's API on bwrap: the endpoint
// the e2b backend's tests run against.
func e2bEndpoint(t *testing.T) *Proc {
	t.Helper()
	p := Start(t, Options{Config: e2bConfigs["bwrap"]})
	require.NotEmpty(t, p.Token)
	return p
}

// e2bBackendConfig is the e2b section pointing at endpoint p.
func e2bBackendConfig(p *Proc) string {
	return fmt.Sprintf(`{"api_key":%q,"api_url":"http://%s/e2b","sandbox_url":"http://%s/e2b/envd"}`, p.Token, p.Addr, p.Addr)
}

// newE2BBackend is an e2b backend of instance on endpoint p.
func newE2BBackend(t *testing.T, p *Proc, instance string) *e2b.Backend {
	t.Helper()
	b, err := e2b.New(e2b.Config{InstanceID: instance, APIKey: p.Token, APIURL: "http://" + p.Addr + "/e2b",
		SandboxURL: "http://" + p.Addr + "/e2b/envd", SessionTTL: 10 * time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Probe(context.Background()))
	return b
}

// e2bBackendEnv is the backend as the shared conformance tests take it.
// Leftover processes are looked for inside the session (the sandbox is
// remote as far as the backend knows).
func e2bBackendEnv(t *testing.T, b *e2b.Backend) backendtest.Env {
	return backendtest.Env{
		Backend: b,
		Spec: func(name string) backends.SandboxSpec {
			s := backends.DefaultSandboxSpec()
			s.SessionID = t.Name() + "/" + name
			s.Image = b.DefaultImage()
			return s
		},
		KernelShared: true,
		NoProcesses: func(t *testing.T, info backends.Session, marker string) {
			t.Helper()
			var out string
			for deadline := time.Now().Add(5 * time.Second); ; {
				out = e2bRun(t, b, info, backendtest.ListProcesses)
				if !strings.Contains(out, marker) || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			assert.NotContains(t, out, marker, "a process was left behind")
		},
	}
}

// e2bRun runs cmd in the session and returns its stdout; it must exit 0.
func e2bRun(t *testing.T, b backends.Backend, info backends.Session, cmd string) string {
	t.Helper()
	var out, errOut backendtest.SyncBuffer
	st, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: cmd, Stdout: &out, Stderr: &errOut, Timeout: 30 * time.Second})
	require.NoError(t, err, "exec %q", cmd)
	require.Equal(t, backends.ExitStatus{}, st, "exec %q: stderr %s", cmd, errOut.String())
	return out.String()
}

func e2bStart(t *testing.T, b *e2b.Backend, name string, mutate func(*backends.SandboxSpec)) backends.Session {
	t.Helper()
	spec := e2bBackendEnv(t, b).Spec(name)
	if mutate != nil {
		mutate(&spec)
	}
	return backendtest.Start(t, b, spec)
}

// TestE2BBackend runs the e2b backend against a second boxrt serving
// E2B's API (bwrap): the shared live exec suite, then sessions, execs,
// files, managed processes, suspend/resume and adoption.
func TestE2BBackend(t *testing.T) {
	p := e2bEndpoint(t)
	b := newE2BBackend(t, p, "e2btest")
	t.Run("live exec", func(t *testing.T) { backendtest.LiveExec(t, e2bBackendEnv(t, b)) })
	t.Run("exec", func(t *testing.T) { e2bExecCases(t, b) })
	t.Run("files", func(t *testing.T) { e2bFileCases(t, b) })
	t.Run("processes", func(t *testing.T) { e2bProcessCases(t, b) })
	t.Run("sessions", func(t *testing.T) { e2bSessionCases(t, p, b) })
}

func e2bExecCases(t *testing.T, b *e2b.Backend) {
	info := e2bStart(t, b, "exec", nil)
	t.Run("output, exit code, env and workdir", func(t *testing.T) {
		var out, errOut backendtest.SyncBuffer
		st, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: `echo "$A"; pwd; echo err >&2; exit 3`,
			Env: map[string]string{"A": "from env"}, Workdir: "/tmp", Stdout: &out, Stderr: &errOut, Timeout: 30 * time.Second})
		require.NoError(t, err)
		assert.Equal(t, 3, st.ExitCode)
		assert.Equal(t, "from env\n/tmp\n", out.String())
		assert.Equal(t, "err\n", errOut.String())
	})
	t.Run("output streams while the command runs", func(t *testing.T) {
		var out backendtest.SyncBuffer
		done := make(chan error, 1)
		go func() {
			_, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: "echo first; sleep 3; echo second",
				Stdout: &out, Stderr: io.Discard, Timeout: 30 * time.Second})
			done <- err
		}()
		backendtest.WaitFor(t, &out, "first")
		select {
		case err := <-done:
			t.Fatalf("the exec ended (%v) before its output was seen streaming", err)
		default:
		}
		require.NoError(t, <-done)
		assert.Equal(t, "first\nsecond\n", out.String())
	})
	t.Run("a timeout kills the tree, the session stays", func(t *testing.T) {
		marker := backendtest.Marker(51)
		start := time.Now()
		st, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: "sleep " + marker + " & sleep " + marker + "; echo never",
			Stdout: io.Discard, Stderr: io.Discard, Timeout: time.Second})
		require.NoError(t, err)
		assert.True(t, st.TimedOut)
		assert.Less(t, time.Since(start), 20*time.Second)
		e2bBackendEnv(t, b).NoProcesses(t, info, marker)
		assert.Equal(t, "ok\n", e2bRun(t, b, info, "echo ok"))
	})
	t.Run("cancel kills the command", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var out backendtest.SyncBuffer
		done := make(chan error, 1)
		go func() {
			_, err := b.Exec(ctx, info, backends.ExecRequest{Cmd: "echo up; exec sleep " + backendtest.Marker(52),
				Stdout: &out, Stderr: io.Discard, Timeout: time.Minute})
			done <- err
		}()
		backendtest.WaitFor(t, &out, "up")
		cancel()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(30 * time.Second):
			t.Fatal("a cancelled exec did not return")
		}
		e2bBackendEnv(t, b).NoProcesses(t, info, backendtest.Marker(52))
	})
	t.Run("a signal envd lacks arrives as SIGTERM", func(t *testing.T) {
		sig := make(chan syscall.Signal)
		var out backendtest.SyncBuffer
		done := make(chan backends.ExitStatus, 1)
		go func() {
			st, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: `trap 'echo got TERM; exit 5' TERM; echo ready; while :; do sleep 0.1; done`,
				Stdout: &out, Stderr: io.Discard, Timeout: time.Minute, Signals: sig})
			assert.NoError(t, err)
			done <- st
		}()
		backendtest.WaitFor(t, &out, "ready")
		sig <- syscall.SIGINT
		select {
		case st := <-done:
			// The command's group gets it: its trap runs (the exit code
			// may be that of a shell of the endpoint's, killed by it).
			assert.NotEqual(t, 0, st.ExitCode)
			assert.Contains(t, out.String(), "got TERM")
		case <-time.After(30 * time.Second):
			t.Fatal("the signalled command did not end")
		}
	})
	t.Run("large output arrives whole", func(t *testing.T) {
		var out bytes.Buffer
		st, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: "head -c 3000000 /dev/zero | tr '\\0' x",
			Stdout: &out, Stderr: io.Discard, Timeout: time.Minute})
		require.NoError(t, err)
		assert.Equal(t, 0, st.ExitCode)
		assert.Equal(t, 3000000, out.Len())
	})
	t.Run("a background process outlives its command", func(t *testing.T) {
		e2bRun(t, b, info, `sleep 1001 >/dev/null 2>&1 </dev/null & echo started`)
		assert.Contains(t, e2bRun(t, b, info, "ps -o args 2>/dev/null || cat /proc/[0-9]*/cmdline | tr '\\0' ' '"), "sleep 1001")
	})
}

func e2bFileCases(t *testing.T, b *e2b.Backend) {
	info := e2bStart(t, b, "files", nil)
	ctx := context.Background()
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	n, err := b.WriteFile(ctx, info, "/workspace/d/bin", bytes.NewReader(data), backends.WriteOptions{})
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), n)
	read := func(p string, off, length int64) []byte {
		rc, _, err := b.ReadFile(ctx, info, p, off, length)
		require.NoError(t, err)
		defer rc.Close()
		got, err := io.ReadAll(rc)
		require.NoError(t, err)
		return got
	}
	assert.True(t, bytes.Equal(data, read("/workspace/d/bin", 0, -1)), "binary round trip")
	assert.Equal(t, data[100:110], read("/workspace/d/bin", 100, 10))
	assert.Equal(t, e2bRun(t, b, info, "cksum < /workspace/d/bin"), e2bRun(t, b, info, "cat /workspace/d/bin | cksum"))

	_, err = b.WriteFile(ctx, info, "/workspace/d/log", strings.NewReader("a\n"), backends.WriteOptions{Append: true})
	require.NoError(t, err)
	_, err = b.WriteFile(ctx, info, "/workspace/d/log", strings.NewReader("b\n"), backends.WriteOptions{Append: true, Mode: 0o600})
	require.NoError(t, err)
	assert.Equal(t, "a\nb\n", string(read("/workspace/d/log", 0, -1)))
	fi, err := b.StatFile(ctx, info, "/workspace/d/log")
	require.NoError(t, err)
	assert.Equal(t, backends.FileTypeFile, fi.Type)
	assert.Equal(t, int64(4), fi.Size)
	assert.Equal(t, uint32(0o600), fi.Mode)

	require.NoError(t, b.MakeDir(ctx, info, "/workspace/d/sub/deeper"))
	require.NoError(t, b.MakeDir(ctx, info, "/workspace/d/sub/deeper"), "an existing directory is fine")
	entries, err := b.ListFiles(ctx, info, "/workspace/d", 1, 100)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	assert.ElementsMatch(t, []string{"bin", "log", "sub"}, names)
	deep, err := b.ListFiles(ctx, info, "/workspace/d", 3, 100)
	require.NoError(t, err)
	assert.Len(t, deep, 4)

	require.NoError(t, b.RenameFile(ctx, info, "/workspace/d/log", "/workspace/d/sub/log"))
	_, err = b.StatFile(ctx, info, "/workspace/d/log")
	assert.ErrorIs(t, err, boxerr.ErrFileNotFound)
	err = b.RemoveFile(ctx, info, "/workspace/d/sub", false)
	var be *boxerr.Error
	require.ErrorAs(t, err, &be, "a non-empty directory without recursive")
	assert.Equal(t, boxerr.ErrValidation, be.Kind)
	require.NoError(t, b.RemoveFile(ctx, info, "/workspace/d/sub", true))
	_, _, err = b.ReadFile(ctx, info, "/workspace/d/sub/log", 0, -1)
	assert.ErrorIs(t, err, boxerr.ErrFileNotFound)
	_, _, err = b.ReadFile(ctx, info, "/workspace/d", 0, -1)
	assert.ErrorIs(t, err, boxerr.ErrValidation, "a directory is not read")
	_, err = b.StatFile(ctx, info, "/etc/passwd")
	assert.ErrorIs(t, err, boxerr.ErrValidation, "the endpoint's own path rules hold (boxrt's file API: only the mounts)")
}

func e2bProcessCases(t *testing.T, b *e2b.Backend) {
	info := e2bStart(t, b, "procs", nil)
	t.Run("stdin, stdout and exit", func(t *testing.T) {
		proc, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{ProcessID: "cat", Command: "sh",
			Args: []string{"-c", "cat; echo bye >&2; exit 4"}, Cwd: "/tmp"})
		require.NoError(t, err)
		_, err = io.WriteString(proc.Stdin(), "hello\n")
		require.NoError(t, err)
		line := make([]byte, 6)
		_, err = io.ReadFull(proc.Stdout(), line)
		require.NoError(t, err)
		assert.Equal(t, "hello\n", string(line))
		require.NoError(t, proc.Stdin().Close())
		errOut, err := io.ReadAll(proc.Stderr())
		require.NoError(t, err)
		assert.Equal(t, "bye\n", string(errOut))
		code, err := proc.Wait()
		require.NoError(t, err)
		assert.Equal(t, 4, code)
	})
	t.Run("a signal ends it", func(t *testing.T) {
		proc, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{ProcessID: "sleep", Command: "sleep", Args: []string{"600"}})
		require.NoError(t, err)
		go func() { _, _ = io.Copy(io.Discard, proc.Stdout()) }()
		go func() { _, _ = io.Copy(io.Discard, proc.Stderr()) }()
		require.NoError(t, proc.Signal(syscall.SIGKILL))
		done := make(chan struct{})
		go func() {
			defer close(done)
			code, err := proc.Wait()
			if err == nil {
				assert.NotEqual(t, 0, code)
			}
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a killed process did not end")
		}
	})
}

func e2bSessionCases(t *testing.T, p *Proc, b *e2b.Backend) {
	ctx := context.Background()
	t.Run("host directories are refused", func(t *testing.T) {
		spec := e2bBackendEnv(t, b).Spec("mounts")
		spec.HostPath, spec.HostPathMode = t.TempDir(), backends.MountRW
		_, err := b.StartSession(ctx, spec)
		assert.ErrorIs(t, err, boxerr.ErrValidation)
	})
	t.Run("an unknown template", func(t *testing.T) {
		spec := e2bBackendEnv(t, b).Spec("template")
		spec.Image = "no-such-template"
		_, err := b.StartSession(ctx, spec)
		assert.ErrorIs(t, err, boxerr.ErrValidation)
		assert.Contains(t, err.Error(), "no-such-template")
	})
	t.Run("a wrong key", func(t *testing.T) {
		bad, err := e2b.New(e2b.Config{InstanceID: "x", APIKey: "e2b_00", APIURL: "http://" + p.Addr + "/e2b"})
		require.NoError(t, err)
		assert.ErrorIs(t, bad.Probe(ctx), boxerr.ErrBackendUnavailable)
	})
	t.Run("suspend, resume, adopt, stop", func(t *testing.T) {
		spec := e2bBackendEnv(t, b).Spec("life")
		info, err := b.StartSession(ctx, spec)
		require.NoError(t, err)
		assert.True(t, b.Alive(ctx, info))
		existing, err := b.Existing(ctx)
		require.NoError(t, err)
		assert.True(t, existing[info.BackendSessionID], "the census lists the sandbox: %v", existing)
		_, err = b.WriteFile(ctx, info, "/workspace/kept", strings.NewReader("kept"), backends.WriteOptions{})
		require.NoError(t, err)
		require.NoError(t, b.Suspend(ctx, info))
		assert.False(t, b.Alive(ctx, info), "a paused sandbox runs nothing")

		// Another process of the same installation finds the session.
		again := newE2BBackend(t, p, "e2btest")
		adopted, err := again.Adopt(ctx)
		require.NoError(t, err)
		var found *backends.Session
		for i := range adopted {
			if adopted[i].SessionID == spec.SessionID {
				found = &adopted[i]
			}
		}
		require.NotNil(t, found, "adopted: %+v", adopted)
		assert.Equal(t, backends.StateSuspended, found.State)
		assert.Equal(t, info.BackendSessionID, found.BackendSessionID)
		others, err := newE2BBackend(t, p, "another").Adopt(ctx)
		require.NoError(t, err)
		assert.Empty(t, others, "another installation's sandboxes are not adopted")

		require.NoError(t, again.Resume(ctx, *found))
		assert.Equal(t, "kept", e2bRun(t, again, *found, "cat /workspace/kept"))
		// A process that never saw the sandbox gets its access token from
		// the control API.
		third := newE2BBackend(t, p, "e2btest")
		assert.Equal(t, "kept", e2bRun(t, third, *found, "cat /workspace/kept"))
		require.NoError(t, again.StopSession(ctx, *found))
		assert.False(t, b.Alive(ctx, info))
		_, err = b.Exec(ctx, info, backends.ExecRequest{Cmd: "true", Stdout: io.Discard, Stderr: io.Discard})
		require.Error(t, err)
		assert.True(t, errors.Is(err, boxerr.ErrSessionNotFound) || errors.Is(err, boxerr.ErrBox), "%v", err)
		require.NoError(t, b.StopSession(ctx, info), "stopping a gone sandbox is fine")
	})
}

// TestE2BBackendRuntime drives a boxrt whose backend is e2b (on a second
// boxrt) through its own JSON-RPC: a session, an exec, files.
func TestE2BBackendRuntime(t *testing.T) {
	endpoint := e2bEndpoint(t)
	p := Start(t, Options{Stdio: true, Config: `{"backend":"e2b","e2b":` + e2bBackendConfig(endpoint) + `}`})
	var info map[string]any
	p.MustCall("box_get_backend_info", map[string]any{}, &info)
	assert.Equal(t, "e2b", info["name"])
	assert.Equal(t, true, info["available"], "%v", info)
	var res map[string]any
	p.MustCall("box_exec", map[string]any{"session_id": "s1", "cmd": "echo hi; echo oops >&2; exit 2"}, &res)
	assert.Equal(t, "hi\n", res["stdout"])
	assert.Equal(t, "oops\n", res["stderr"])
	assert.Equal(t, float64(2), res["exit_code"])
	p.MustCall("box_exec", map[string]any{"session_id": "s1", "cmd": "sleep 30", "timeout_sec": 1}, &res)
	assert.Equal(t, "timed_out", res["status"], "%v", res)
	p.MustCall("box_fs_write", map[string]any{"session_id": "s1", "path": "/workspace/f", "data_base64": base64.StdEncoding.EncodeToString([]byte("via e2b"))}, nil)
	p.MustCall("box_fs_read", map[string]any{"session_id": "s1", "path": "/workspace/f"}, &res)
	assert.Equal(t, base64.StdEncoding.EncodeToString([]byte("via e2b")), res["data_base64"], "%v", res)

	// A managed process runs as a background command; its exit is seen.
	var got map[string]any
	p.MustCall("box_start_managed_process", map[string]any{"session_id": "s1",
		"spec": map[string]any{"process_id": "quitter", "command": "sh", "args": []string{"-c", "sleep 1; echo bye >&2; exit 3"}}}, nil)
	require.Eventually(t, func() bool {
		p.MustCall("box_get_managed_process", map[string]any{"session_id": "s1", "process_id": "quitter"}, &got)
		return got["status"] == "exited"
	}, 30*time.Second, 100*time.Millisecond)
	assert.Equal(t, float64(3), got["exit_code"], "%v", got)
	assert.Equal(t, "bye", got["stderr_preview"])

	// Suspend is E2B's pause: files kept.
	p.MustCall("box_suspend_session", map[string]any{"session_id": "s1"}, nil)
	p.MustCall("box_exec", map[string]any{"session_id": "s1", "cmd": "cat /workspace/f"}, &res)
	assert.Equal(t, "via e2b", res["stdout"], "%v", res)
	p.MustCall("box_delete_session", map[string]any{"session_id": "s1"}, nil)
	var list []map[string]any
	status, body := e2bCall(t, "GET", "http://"+endpoint.Addr+"/e2b/v2/sandboxes", map[string]string{"X-API-Key": endpoint.Token}, nil)
	require.Equal(t, 200, status)
	require.NoError(t, json.Unmarshal(body, &list))
	assert.Empty(t, list, "deleting the session killed its sandbox")
}

// TestDoctorE2B: doctor checks a configured e2b endpoint with its key.
func TestDoctorE2B(t *testing.T) {
	endpoint := e2bEndpoint(t)
	doctor := func(key string) (usable []string, e2bChecks []string) {
		t.Helper()
		conf := fmt.Sprintf(`{"backend":"e2b","e2b":{"api_key":%q,"api_url":"http://%s/e2b"}}`, key, endpoint.Addr)
		cmd := exec.Command(binPath, "doctor", "--json", "--state-dir", t.TempDir())
		cmd.Env = append(os.Environ(), "BOXRT_CONFIG="+conf)
		out, _ := cmd.Output()
		var rep struct {
			Checks []struct{ Backend, Status, What, Fix string } `json:"checks"`
			Usable []string                                      `json:"usable_backends"`
		}
		require.NoError(t, json.Unmarshal(out, &rep), "%s", out)
		for _, ch := range rep.Checks {
			if ch.Backend == "e2b" {
				e2bChecks = append(e2bChecks, ch.Status+": "+ch.What+" "+ch.Fix)
			}
		}
		return rep.Usable, e2bChecks
	}
	usable, checks := doctor(endpoint.Token)
	assert.Contains(t, usable, "e2b", "%v", checks)
	require.Len(t, checks, 1)
	assert.Contains(t, checks[0], "ok: the E2B control API answers")

	usable, checks = doctor("e2b_0000")
	assert.NotContains(t, usable, "e2b")
	require.Len(t, checks, 1)
	assert.Contains(t, checks[0], "fail: ")
	assert.Contains(t, checks[0], "e2b.api_key")
}
