package test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// e2bConfigs run the SDK's sandboxes on each backend: the SDK's commands
// are /bin/bash -l -c, so docker runs boxrt's Debian image (the busybox
// test image has no bash), named by an e2b.templates entry.
var e2bConfigs = map[string]string{
	"bwrap":  `{"backend":"bwrap",` + e2bEgress + `}`,
	"docker": `{"backend":"docker","docker":{"image":"boxrt-test:busybox"},"e2b":{"templates":{"base":"boxrt-sandbox:latest"}},` + e2bEgress + `}`,
}

// e2bEgress names the hosts the network step of scenario.mjs resolves
// (addresses of TEST-NET-3: nothing is contacted).
const e2bEgress = `"egress":{"hosts":{"api.test":"203.0.113.10","other.test":"203.0.113.11"}}`

// e2bSDK installs the pinned E2B SDK into test/e2b and returns that
// directory.
func e2bSDK(t *testing.T) string { return npmPackages(t, "e2b") }

// npmPackages installs the npm packages pinned in test/<name> (once per
// lockfile: its hash is kept beside node_modules) and returns that
// directory.
func npmPackages(t *testing.T, name string) string {
	t.Helper()
	dir, err := filepath.Abs(name)
	require.NoError(t, err)
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	require.NoError(t, err)
	sum := sha256.Sum256(lock)
	stamp := filepath.Join(dir, "node_modules", ".boxrt-lock-sha256")
	if got, err := os.ReadFile(stamp); err == nil && string(got) == hex.EncodeToString(sum[:]) {
		return dir
	}
	_, err = exec.LookPath("npm")
	require.NoError(t, err, "node and npm are needed (scripts/setup installs them)")
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "npm ci: %s", out)
	require.NoError(t, os.WriteFile(stamp, []byte(hex.EncodeToString(sum[:])), 0o644))
	return dir
}

// sdkNode is the node that runs the SDK's scripts: $BOXRT_SDK_NODE
// (scripts/test names a newer one when the machine's is older than the
// SDK needs), else node on PATH.
func sdkNode() string {
	if n := os.Getenv("BOXRT_SDK_NODE"); n != "" {
		return n
	}
	return "node"
}

// e2bEnv is what an E2B user sets to point the SDK at p.
func e2bEnv(p *Proc, key string) []string {
	return append(os.Environ(), "E2B_API_URL=http://"+p.Addr+"/e2b", "E2B_SANDBOX_URL=http://"+p.Addr+"/e2b/envd",
		"E2B_API_KEY="+key)
}

// TestE2BSDK runs the official E2B JS SDK's scenario against boxrt.
func TestE2BSDK(t *testing.T) {
	dir := e2bSDK(t)
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			p := Start(t, Options{Config: e2bConfigs[backend]})
			require.NotEmpty(t, p.Token)
			cmd := exec.Command(sdkNode(), "scenario.mjs")
			cmd.Dir = dir
			// boxrt's token is not E2B-shaped (e2b_ + hex); the SDK sends
			// it as it is.
			cmd.Env = e2bEnv(p, p.Token)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				require.NoError(t, err, "scenario:\n%s", out.String())
			case <-time.After(4 * time.Minute):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("scenario did not finish in 4 minutes:\n%s", out.String())
			}
			assert.Contains(t, out.String(), "scenario done")
			t.Logf("scenario:\n%s", out.String())
		})
	}
}

// e2bCall sends one request to p and returns status and body.
func e2bCall(t *testing.T, method, url string, headers map[string]string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// connectFrame is one Connect streaming envelope.
func connectFrame(flags byte, payload []byte) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

// TestE2BBadInput: malformed and hostile requests get E2B's or Connect's
// error shapes, and boxrt keeps serving.
func TestE2BBadInput(t *testing.T) {
	p := Start(t, Options{Config: e2bConfigs["bwrap"]})
	api := "http://" + p.Addr + "/e2b"
	key := map[string]string{"X-API-Key": p.Token, "Content-Type": "application/json"}
	e2bError := func(t *testing.T, status int, body []byte, want int) {
		t.Helper()
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		require.NoError(t, json.Unmarshal(body, &e), "%s", body)
		assert.Equal(t, want, status, "%s", body)
		assert.Equal(t, want, e.Code)
		assert.NotEmpty(t, e.Message)
	}
	connectError := func(t *testing.T, status int, body []byte, wantStatus int, wantCode string) {
		t.Helper()
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		require.NoError(t, json.Unmarshal(body, &e), "%s", body)
		assert.Equal(t, wantStatus, status, "%s", body)
		assert.Equal(t, wantCode, e.Code, "%s", body)
	}

	status, body := e2bCall(t, "POST", api+"/sandboxes", key, []byte(`{"templateID":`))
	e2bError(t, status, body, 400)
	status, body = e2bCall(t, "POST", api+"/sandboxes", key, []byte(`{"templateID":"no-such-template"}`))
	e2bError(t, status, body, 404)
	status, body = e2bCall(t, "POST", api+"/sandboxes", key, []byte(`{"templateID":"base","timeout":-5}`))
	e2bError(t, status, body, 400)
	status, body = e2bCall(t, "POST", api+"/sandboxes", key, []byte(`{"templateID":"base","envVars":{"A=B":"x"}}`))
	e2bError(t, status, body, 400)
	status, body = e2bCall(t, "GET", api+"/sandboxes/nope", key, nil)
	e2bError(t, status, body, 404)
	status, body = e2bCall(t, "DELETE", api+"/sandboxes/nope", key, nil)
	e2bError(t, status, body, 404)
	status, body = e2bCall(t, "POST", api+"/sandboxes/nope/fork", key, nil)
	e2bError(t, status, body, 404)
	status, body = e2bCall(t, "GET", api+"/sandboxes/nope/metrics", key, nil)
	e2bError(t, status, body, 404)
	status, body = e2bCall(t, "GET", api+"/no/such/route", key, nil)
	e2bError(t, status, body, 404)
	status, body = e2bCall(t, "GET", api+"/sandboxes", map[string]string{"X-API-Key": "e2b_00"}, nil)
	e2bError(t, status, body, 401)

	status, body = e2bCall(t, "POST", api+"/sandboxes", key, []byte(`{"templateID":"base","timeout":120}`))
	require.Equal(t, 201, status, "%s", body)
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	require.NoError(t, json.Unmarshal(body, &sb))
	t.Cleanup(func() { e2bCall(t, "DELETE", api+"/sandboxes/"+sb.SandboxID, key, nil) })
	for _, list := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running", "/sandboxes?metadata=k%3Dv"} {
		status, body := e2bCall(t, "GET", api+list, key, nil)
		require.Equal(t, 200, status, "%s", body)
		assert.Equal(t, list != "/sandboxes?metadata=k%3Dv", strings.Contains(string(body), sb.SandboxID), "%s: %s", list, body)
	}
	status, body = e2bCall(t, "GET", api+"/v2/sandboxes?state=paused", key, nil)
	require.Equal(t, 200, status, "%s", body)
	assert.Equal(t, "[]\n", string(body))

	// Metrics: one sample now, in E2B's SandboxMetric shape.
	status, body = e2bCall(t, "GET", api+"/sandboxes/"+sb.SandboxID+"/metrics", key, nil)
	require.Equal(t, 200, status, "%s", body)
	var samples []struct {
		TimestampUnix int64   `json:"timestampUnix"`
		CPUCount      int     `json:"cpuCount"`
		CPUUsedPct    float64 `json:"cpuUsedPct"`
		MemUsed       int64   `json:"memUsed"`
		MemTotal      int64   `json:"memTotal"`
		DiskTotal     int64   `json:"diskTotal"`
	}
	require.NoError(t, json.Unmarshal(body, &samples), "%s", body)
	require.Len(t, samples, 1)
	assert.WithinDuration(t, time.Now(), time.Unix(samples[0].TimestampUnix, 0), time.Minute)
	assert.Equal(t, 1, samples[0].CPUCount)
	assert.Equal(t, int64(512<<20), samples[0].MemTotal, "the session's memory limit")
	assert.Positive(t, samples[0].DiskTotal)
	status, body = e2bCall(t, "GET", api+"/sandboxes/metrics?sandbox_ids="+sb.SandboxID+",nope", key, nil)
	require.Equal(t, 200, status, "%s", body)
	assert.Contains(t, string(body), `"`+sb.SandboxID+`":{"timestamp"`)
	assert.NotContains(t, string(body), "nope")

	envd := api + "/envd"
	rpc := func(id, token, ctype string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": token, "Content-Type": ctype}
	}
	ok := rpc(sb.SandboxID, sb.EnvdAccessToken, "application/json")
	t.Run("unknown sandbox", func(t *testing.T) {
		status, body := e2bCall(t, "POST", envd+"/process.Process/List", rpc("nope", sb.EnvdAccessToken, "application/json"), []byte(`{}`))
		connectError(t, status, body, 502, "unavailable")
		status, body = e2bCall(t, "GET", envd+"/files?path=/tmp/x", rpc("nope", sb.EnvdAccessToken, ""), nil)
		e2bError(t, status, body, 502)
	})
	t.Run("wrong or missing access token", func(t *testing.T) {
		status, body := e2bCall(t, "POST", envd+"/process.Process/List", rpc(sb.SandboxID, "wrong", "application/json"), []byte(`{}`))
		connectError(t, status, body, 401, "unauthenticated")
		status, body = e2bCall(t, "POST", envd+"/process.Process/List", rpc(sb.SandboxID, "", "application/json"), []byte(`{}`))
		connectError(t, status, body, 401, "unauthenticated")
		status, body = e2bCall(t, "GET", envd+"/files?path=/etc/hostname", rpc(sb.SandboxID, "", ""), nil)
		e2bError(t, status, body, 401)
	})
	t.Run("malformed unary message", func(t *testing.T) {
		status, body := e2bCall(t, "POST", envd+"/process.Process/List", ok, []byte(`{"processes":`))
		connectError(t, status, body, 400, "invalid_argument")
		status, body = e2bCall(t, "POST", envd+"/filesystem.Filesystem/Stat", ok, []byte(`{"path":12}`))
		connectError(t, status, body, 400, "invalid_argument")
	})
	t.Run("malformed stream frames", func(t *testing.T) {
		h := rpc(sb.SandboxID, sb.EnvdAccessToken, "application/connect+json")
		for name, frame := range map[string][]byte{
			"short header":  {0, 0, 0},
			"short payload": connectFrame(0, []byte(`{"process":{"cmd":"true"}}`))[:12],
			"not json":      connectFrame(0, []byte(`not json`)),
			"oversized":     append([]byte{0, 0x7f, 0xff, 0xff, 0xff}, bytes.Repeat([]byte("x"), 64)...),
			"empty cmd":     connectFrame(0, []byte(`{"process":{"cmd":""}}`)),
		} {
			status, body := e2bCall(t, "POST", envd+"/process.Process/Start", h, frame)
			assert.Equal(t, 200, status, "%s: %s", name, body)
			// The stream's end message carries the error.
			require.GreaterOrEqual(t, len(body), 5, name)
			assert.Equal(t, byte(2), body[0]&2, "%s: an end-stream frame: %q", name, body)
			assert.Contains(t, string(body), `"error"`, name)
		}
	})
	t.Run("oversized unary message", func(t *testing.T) {
		big := []byte(`{"path":"` + strings.Repeat("a", 5<<20) + `"}`)
		status, body := e2bCall(t, "POST", envd+"/filesystem.Filesystem/Stat", ok, big)
		connectError(t, status, body, 429, "resource_exhausted")
	})
	t.Run("unknown process and watcher", func(t *testing.T) {
		status, body := e2bCall(t, "POST", envd+"/process.Process/SendSignal", ok, []byte(`{"process":{"pid":4242},"signal":"SIGNAL_SIGKILL"}`))
		connectError(t, status, body, 404, "not_found")
		status, body = e2bCall(t, "POST", envd+"/filesystem.Filesystem/GetWatcherEvents", ok, []byte(`{"watcherId":"w-nope"}`))
		connectError(t, status, body, 404, "not_found")
		status, body = e2bCall(t, "POST", envd+"/filesystem.Filesystem/CreateWatcher", ok, []byte(`{"path":"/tmp/no/such/dir"}`))
		connectError(t, status, body, 404, "not_found")
	})
	t.Run("polled watcher", func(t *testing.T) {
		status, body := e2bCall(t, "POST", envd+"/filesystem.Filesystem/MakeDir", ok, []byte(`{"path":"/tmp/polled"}`))
		require.Equal(t, 200, status, "%s", body)
		status, body = e2bCall(t, "POST", envd+"/filesystem.Filesystem/CreateWatcher", ok, []byte(`{"path":"/tmp/polled"}`))
		require.Equal(t, 200, status, "%s", body)
		var cw struct {
			WatcherID string `json:"watcherId"`
		}
		require.NoError(t, json.Unmarshal(body, &cw))
		status, body = e2bCall(t, "POST", envd+"/files?path=/tmp/polled/a.txt", rpc(sb.SandboxID, sb.EnvdAccessToken, "application/octet-stream"), []byte("a"))
		require.Equal(t, 200, status, "%s", body)
		type event struct{ Name, Type string }
		var events []event
		for i := 0; i < 50 && len(events) == 0; i++ {
			time.Sleep(100 * time.Millisecond)
			status, body = e2bCall(t, "POST", envd+"/filesystem.Filesystem/GetWatcherEvents", ok, []byte(`{"watcherId":"`+cw.WatcherID+`"}`))
			require.Equal(t, 200, status, "%s", body)
			var got struct{ Events []event }
			require.NoError(t, json.Unmarshal(body, &got))
			events = append(events, got.Events...)
		}
		assert.Equal(t, []event{{Name: "a.txt", Type: "EVENT_TYPE_CREATE"}}, events)
		status, body = e2bCall(t, "POST", envd+"/filesystem.Filesystem/RemoveWatcher", ok, []byte(`{"watcherId":"`+cw.WatcherID+`"}`))
		assert.Equal(t, 200, status, "%s", body)
		status, body = e2bCall(t, "POST", envd+"/filesystem.Filesystem/GetWatcherEvents", ok, []byte(`{"watcherId":"`+cw.WatcherID+`"}`))
		connectError(t, status, body, 404, "not_found")
	})
	// Still serving after all of it.
	status, body = e2bCall(t, "POST", envd+"/process.Process/List", ok, []byte(`{}`))
	assert.Equal(t, 200, status, "%s", body)
	status, _ = e2bCall(t, "GET", envd+"/health", rpc(sb.SandboxID, sb.EnvdAccessToken, ""), nil)
	assert.Equal(t, 204, status)
}

// TestE2BTenantKeys: a key of e2b.api_keys works in its own Workspace,
// whose sandboxes no other key (nor the control token) sees.
func TestE2BTenantKeys(t *testing.T) {
	p := Start(t, Options{Config: `{"backend":"bwrap","e2b":{"api_keys":{"key-a":"workspace-a","key-b":"workspace-b"}}}`})
	api := "http://" + p.Addr + "/e2b"
	as := func(key string) map[string]string {
		return map[string]string{"X-API-Key": key, "Content-Type": "application/json"}
	}
	status, body := e2bCall(t, "POST", api+"/sandboxes", as("key-a"), []byte(`{"templateID":"base","timeout":120}`))
	require.Equal(t, 201, status, "%s", body)
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	require.NoError(t, json.Unmarshal(body, &sb))
	t.Cleanup(func() { e2bCall(t, "DELETE", api+"/sandboxes/"+sb.SandboxID, as("key-a"), nil) })

	listed := func(key string) bool {
		status, body := e2bCall(t, "GET", api+"/v2/sandboxes", as(key), nil)
		require.Equal(t, 200, status, "%s", body)
		return strings.Contains(string(body), sb.SandboxID)
	}
	assert.True(t, listed("key-a"))
	assert.False(t, listed("key-b"), "another key's sandboxes are invisible")
	assert.False(t, listed(p.Token), "the control token's namespace is not a key's")
	for _, key := range []string{"key-b", p.Token} {
		status, _ = e2bCall(t, "GET", api+"/sandboxes/"+sb.SandboxID, as(key), nil)
		assert.Equal(t, 404, status)
		status, _ = e2bCall(t, "DELETE", api+"/sandboxes/"+sb.SandboxID, as(key), nil)
		assert.Equal(t, 404, status)
	}
	status, _ = e2bCall(t, "GET", api+"/v2/sandboxes", as("key-c"), nil)
	assert.Equal(t, 401, status)

	h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/json"}
	status, body = e2bCall(t, "POST", api+"/envd/process.Process/List", h, []byte(`{}`))
	assert.Equal(t, 200, status, "%s", body)
	status, body = e2bCall(t, "GET", api+"/sandboxes/"+sb.SandboxID, as("key-a"), nil)
	assert.Equal(t, 200, status, "%s", body)
}

// TestE2BRecordsSurviveRestart: a paused sandbox's E2B record (its access
// token, metadata) is kept in the state directory, so after a restart on
// the same directory the SDK's old handle still opens it.
func TestE2BRecordsSurviveRestart(t *testing.T) {
	state := t.TempDir()
	p := Start(t, Options{Config: e2bConfigs["bwrap"], StateDir: state})
	api := "http://" + p.Addr + "/e2b"
	key := map[string]string{"X-API-Key": p.Token, "Content-Type": "application/json"}
	status, body := e2bCall(t, "POST", api+"/sandboxes", key, []byte(`{"templateID":"base","timeout":300,"metadata":{"owner":"me"}}`))
	require.Equal(t, 201, status, "%s", body)
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	require.NoError(t, json.Unmarshal(body, &sb))
	status, body = e2bCall(t, "POST", api+"/sandboxes/"+sb.SandboxID+"/pause", key, nil)
	require.Equal(t, 204, status, "%s", body)
	p.Stop()

	p = Start(t, Options{Config: e2bConfigs["bwrap"], StateDir: state})
	api = "http://" + p.Addr + "/e2b"
	status, body = e2bCall(t, "GET", api+"/sandboxes/"+sb.SandboxID, key, nil)
	require.Equal(t, 200, status, "%s", body)
	var got struct {
		EnvdAccessToken string            `json:"envdAccessToken"`
		State           string            `json:"state"`
		Metadata        map[string]string `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal(body, &got))
	assert.Equal(t, sb.EnvdAccessToken, got.EnvdAccessToken, "the access token survives the restart")
	assert.Equal(t, "paused", got.State)
	assert.Equal(t, map[string]string{"owner": "me"}, got.Metadata)
	status, body = e2bCall(t, "POST", api+"/sandboxes/"+sb.SandboxID+"/connect", key, []byte(`{"timeout":60}`))
	require.Equal(t, 201, status, "%s", body)
	status, body = e2bCall(t, "POST", api+"/envd/process.Process/List",
		map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/json"}, []byte(`{}`))
	assert.Equal(t, 200, status, "the old handle's token opens the resumed sandbox: %s", body)
	status, _ = e2bCall(t, "DELETE", api+"/sandboxes/"+sb.SandboxID, key, nil)
	assert.Equal(t, 204, status)
	entries, err := os.ReadDir(filepath.Join(state, "e2b"))
	require.NoError(t, err)
	assert.Empty(t, entries, "a killed sandbox's record is removed")
}
