package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The first hour of a new user (#41): the README's and --help's commands
// run as written, taken from the files themselves so that docs and tests
// cannot drift, and a regression test for each thing that failed.

// codeBlock is a fenced block of a Markdown file.
type codeBlock struct {
	lang  string
	lines []string
}

func codeBlocks(t *testing.T, path string) []codeBlock {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var blocks []codeBlock
	var cur *codeBlock
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &codeBlock{lang: strings.TrimPrefix(line, "```")}
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, line)
		}
	}
	return blocks
}

// runBin runs the boxrt binary with env added and returns stdout, stderr
// and the exit status.
func runBin(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	return runBinWithStdin(t, nil, env, args...)
}

// runBinWithStdin is runBin with stdin fed to the command. The control
// token variables are cleared, so a token comes only from what the test
// passes or the state directory.
func runBinWithStdin(t *testing.T, stdin io.Reader, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = append(append(os.Environ(), "BOXRT_CONTROL_TOKEN=", "LANGBOT_BOX_CONTROL_TOKEN="), env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return stdout.String(), stderr.String(), ee.ExitCode()
	}
	require.NoError(t, err, "stderr: %s", stderr.String())
	return stdout.String(), stderr.String(), 0
}

// wireScalar is a "key":value pair with a scalar value as a transcript
// shows it.
var wireScalar = regexp.MustCompile(`"\w+":("(?:[^"\\]|\\.)*"|true|false|-?\d+)`)

// checkTranscript sends a wscat transcript's "> " lines and checks that
// each answer holds every key-value pair its "< " line shows.
func checkTranscript(t *testing.T, ws *WS, lines []string, backend string) {
	t.Helper()
	sent := 0
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "> "):
			ws.Send([]byte(strings.TrimPrefix(line, "> ")))
			sent++
		case strings.HasPrefix(line, "< "):
			got := ws.Read(2 * time.Minute)
			raw, _ := json.Marshal(got.Result)
			require.Nil(t, got.Error, "%s", line)
			for _, pair := range wireScalar.FindAllString(line, -1) {
				pair = strings.ReplaceAll(pair, `"bwrap"`, `"`+backend+`"`)
				if strings.HasPrefix(pair, `"jsonrpc"`) || strings.HasPrefix(pair, `"id"`) {
					continue
				}
				assert.Contains(t, string(raw), pair, "answer to the line before %s", line)
			}
		}
	}
	require.NotZero(t, sent, "the transcript sends nothing")
}

// TestReadmeWalk runs README.md's commands as written, in order, against
// a runtime started as the README says (bin/boxrt serve, which
// scripts/run execs), found at the default address with its generated
// token: every bin/boxrt line of its sh blocks, then the wscat session.
func TestReadmeWalk(t *testing.T) {
	onEachBackend(t, func(t *testing.T, backend string) {
		u := newUserEnv(t, backend)
		u.serve(t, "bin/boxrt serve")
		require.NoError(t, os.WriteFile(filepath.Join(u.dir, "data.csv"), []byte("a,b\n1,2\n"), 0o644))
		blocks := codeBlocks(t, "../README.md")
		seen := map[string]bool{}
		for _, b := range blocks {
			for _, line := range b.lines {
				if b.lang != "sh" || !strings.HasPrefix(line, "bin/boxrt ") {
					continue
				}
				stdout, stderr, code := u.run(t, line)
				require.Equal(t, 0, code, "%s\nstdout: %s\nstderr: %s", line, stdout, stderr)
				checkReadmeLine(t, u, line, stdout, stderr, backend)
				seen[strings.Fields(line)[1]] = true
			}
		}
		for _, cmd := range []string{"exec", "sessions", "call", "cp"} {
			assert.True(t, seen[cmd], "the README shows no bin/boxrt %s line", cmd)
		}
		walkWscat(t, u, blocks, backend)
	})
}

// checkReadmeLine checks what a README line promises beyond exit status 0.
func checkReadmeLine(t *testing.T, u *userEnv, line, stdout, stderr, backend string) {
	t.Helper()
	switch {
	case strings.Contains(line, "echo hello from"):
		assert.Equal(t, "hello from Linux\n", stdout, line)
	case strings.HasPrefix(line, "bin/boxrt sessions"):
		assert.Regexp(t, `(?m)^demo\s+running\s+`+backend+`\s`, stdout, line)
	case strings.Contains(line, "--exit-code"):
		assert.Contains(t, stdout, "exit status 3", line)
	case strings.Contains(line, `"stream":true`):
		assert.Equal(t, "1\n2\n3\n", stderr, line)
	case strings.HasPrefix(line, "bin/boxrt cp demo:"):
		b, err := os.ReadFile(filepath.Join(u.dir, "copy.csv"))
		require.NoError(t, err, line)
		assert.Equal(t, "a,b\n1,2\n", string(b), line)
	}
	assert.NotContains(t, stdout, `"error"`, line)
}

// walkWscat runs the README's wscat session: its token line, then its
// URL and header with a WebSocket client of ours (wscat would come from
// npm), then its transcript.
func walkWscat(t *testing.T, u *userEnv, blocks []codeBlock, backend string) {
	t.Helper()
	for _, b := range blocks {
		var tokenLine, wscatLine string
		for _, line := range b.lines {
			switch {
			case strings.HasPrefix(line, "$ TOKEN="):
				tokenLine = strings.TrimPrefix(line, "$ ")
			case strings.HasPrefix(line, "$ npx wscat "):
				wscatLine = strings.TrimPrefix(line, "$ ")
			}
		}
		if wscatLine == "" {
			continue
		}
		require.NotEmpty(t, tokenLine, "the wscat block sets no TOKEN")
		ws := u.dialWS(t, wscatURL(t, wscatLine), wscatHeader(t, u, tokenLine, wscatLine))
		checkTranscript(t, ws, b.lines, backend)
		return
	}
	t.Fatal("README.md has no wscat session")
}

var (
	wscatURLArg    = regexp.MustCompile(`-c (\S+)`)
	wscatHeaderArg = regexp.MustCompile(`-H ("[^"]*")`)
)

func wscatURL(t *testing.T, line string) string {
	m := wscatURLArg.FindStringSubmatch(line)
	require.NotNil(t, m, "no -c URL in %s", line)
	return m[1]
}

// wscatHeader is the -H argument of a wscat line as the shell expands
// it, after setup (the README's TOKEN= line).
func wscatHeader(t *testing.T, u *userEnv, setup, line string) string {
	t.Helper()
	m := wscatHeaderArg.FindStringSubmatch(line)
	require.NotNil(t, m, "no -H in %s: the upgrade would be refused with 401", line)
	out, stderr, code := u.run(t, setup+"\nprintf '%s' "+m[1])
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, out, "Bearer \n", "empty token")
	return out
}

func requireDockerImage(t *testing.T) {
	t.Helper()
	if err := exec.Command("docker", "image", "inspect", "boxrt-test:busybox").Run(); err != nil {
		t.Skip("docker or its test image boxrt-test:busybox is missing (scripts/setup)")
	}
}

// TestReadmeScriptsRun runs the README's first step, scripts/run, with
// its stderr in a pipe (#41 item 7): it says it is building before the
// build, and its log, not on a terminal, has no colour codes.
func TestReadmeScriptsRun(t *testing.T) {
	u := newUserEnv(t, "bwrap")
	script, err := filepath.Abs("../scripts/run")
	require.NoError(t, err)
	log := u.serve(t, script).String()
	assert.Regexp(t, `(?s)building bin/boxrt.*built bin/boxrt in \d+s.*boxrt serving`, log)
	assert.NotContains(t, log, "\x1b[", "colour codes in a pipe")
	assert.Contains(t, log, `"message":"boxrt serving"`, "JSON lines when stderr is no terminal")
	_, stderr, code := u.run(t, "bin/boxrt call __ping")
	assert.Equal(t, 0, code, stderr)
}

// TestHelpQuickStart runs `boxrt --help`'s quick start as written: its
// boxrt serve line starts the runtime, the other boxrt lines and the
// wscat line (its token path is this user's) run against it.
func TestHelpQuickStart(t *testing.T) {
	onEachBackend(t, helpQuickStart)
}

func helpQuickStart(t *testing.T, backend string) {
	u := newUserEnv(t, backend)
	help, _, code := u.run(t, "boxrt --help")
	require.Equal(t, 0, code)
	start := strings.Index(help, "Quick start")
	end := strings.Index(help, "Protocol reference")
	require.True(t, start >= 0 && end > start, help)
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(help[start:end]))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "boxrt ") || strings.HasPrefix(line, "npx wscat ") || strings.HasPrefix(line, "> ") {
			lines = append(lines, line)
		}
	}
	require.True(t, len(lines) > 3 && strings.HasPrefix(lines[0], "boxrt serve "), "%q", lines)
	u.serve(t, lines[0])
	ran := 0
	for _, line := range lines[1:] {
		switch {
		case strings.HasPrefix(line, "boxrt "):
			stdout, stderr, code := u.run(t, line)
			assert.Equal(t, 0, code, "%s\nstdout: %s\nstderr: %s", line, stdout, stderr)
			assert.NotContains(t, stdout, `"error"`, line)
			ran++
		case strings.HasPrefix(line, "npx wscat "):
			ws := u.dialWS(t, wscatURL(t, line), wscatHeader(t, u, "", line))
			for _, req := range lines {
				if strings.HasPrefix(req, "> ") {
					ws.Send([]byte(strings.TrimPrefix(req, "> ")))
					r := ws.Read(time.Minute)
					assert.Nil(t, r.Error, req)
					ran++
				}
			}
		}
	}
	assert.GreaterOrEqual(t, ran, 4)
}

// TestReadmeGoExample compiles the README's Go example as a program of
// this module and runs it: it spawns the boxrt on its PATH.
func TestReadmeGoExample(t *testing.T) {
	var src string
	for _, b := range codeBlocks(t, "../README.md") {
		if b.lang == "go" {
			src = strings.Join(b.lines, "\n") + "\n"
		}
	}
	require.NotEmpty(t, src, "README.md has no Go example")
	dir := t.TempDir()
	main := filepath.Join(dir, "main.go")
	require.NoError(t, os.WriteFile(main, []byte(src), 0o644))
	// An overlay places it in the module, which it imports, without
	// writing into the source tree.
	module, err := filepath.Abs("..")
	require.NoError(t, err)
	overlay := filepath.Join(dir, "overlay.json")
	ov, _ := json.Marshal(map[string]any{"Replace": map[string]string{filepath.Join(module, "test", "readmeexample", "main.go"): main}})
	require.NoError(t, os.WriteFile(overlay, ov, 0o644))
	exe := filepath.Join(dir, "example")
	build := exec.Command("go", "build", "-overlay", overlay, "-o", exe, "./test/readmeexample")
	build.Dir = module
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(binPath)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"BOXRT_CONFIG={"+backendConfigs["bwrap"]+"}", "BOXRT_STATE_DIR=", "BOXRT_CONTROL_TOKEN=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stderr: %s", stderr.String())
	assert.Equal(t, "HELLO\nexit code 0, out.txt: HELLO\n", stdout.String())
}

// TestCallCpExecSessionsShareTheDefaultURL: without --url every client
// command dials the runtime `boxrt serve` runs by default, and says so
// when none answers (#41 item 2).
func TestCallCpExecSessionsShareTheDefaultURL(t *testing.T) {
	u := newUserEnv(t, "bwrap")
	for _, line := range []string{"boxrt call __ping", "boxrt exec s1 -- true", "boxrt sessions", "boxrt cp s1:/etc/hostname -"} {
		stdout, stderr, code := u.run(t, line)
		assert.NotEqual(t, 0, code, line)
		assert.NotEqual(t, 2, code, "not a usage error: %s: %s", line, stderr)
		assert.Contains(t, stdout+stderr, "nothing answers at the default --url ws://127.0.0.1:5410", line)
	}
}

// TestCallCpExecSessionsTakeFlagsAnywhere: flags before, between and
// after the arguments, as the docs write them (#41 item 1); after "--"
// everything is exec's command.
func TestCallCpExecSessionsTakeFlagsAnywhere(t *testing.T) {
	p := Start(t, Options{Config: "{" + backendConfigs["bwrap"] + "}"})
	url := "http://" + p.Addr
	env := []string{"BOXRT_STATE_DIR=" + p.State}
	local := filepath.Join(t.TempDir(), "in.txt")
	require.NoError(t, os.WriteFile(local, []byte("flags\n"), 0o644))

	for _, args := range [][]string{
		{"exec", "fa", "--url", url, "--", "echo", "--url", "x"},
		{"exec", "--url", url, "fa", "--", "echo", "--url", "x"},
	} {
		stdout, stderr, code := runBin(t, env, args...)
		require.Equal(t, 0, code, "%q: %s", args, stderr)
		assert.Equal(t, "--url x\n", stdout, "%q", args)
	}
	for _, args := range [][]string{
		{"cp", local, "fa:/workspace/in.txt", "--url", url},
		{"cp", local, "--url", url, "fa:/workspace/in2.txt", "--progress=false"},
	} {
		_, stderr, code := runBin(t, env, args...)
		assert.Equal(t, 0, code, "%q: %s", args, stderr)
	}
	stdout, stderr, code := runBin(t, env, "sessions", "--url", url)
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "fa ")
	stdout, stderr, code = runBin(t, env, "call", "box_fs_read", `{"session_id":"fa","path":"/workspace/in2.txt"}`, "--url", url)
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, `"data_base64"`)
	_, stderr, code = runBin(t, env, "serve", "stray")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "takes no arguments")
}

// TestStdioListensOnlyWhereAsked: `serve --stdio` without --listen takes
// a free port, not the default one, so that two stdio runtimes (and a
// serving one) coexist (#41 item 3); an explicit --listen is kept.
func TestStdioListensOnlyWhereAsked(t *testing.T) {
	explicit := freeAddr(t)
	extra := [][]string{nil, nil, {"--listen", explicit}}
	urls := make([]string, len(extra))
	var wg sync.WaitGroup
	for i, args := range extra {
		wg.Add(1)
		go func() {
			defer wg.Done()
			urls[i] = stdioRelayURL(t, args...)
		}()
	}
	wg.Wait()
	for _, u := range urls[:2] {
		assert.Regexp(t, `^http://127\.0\.0\.1:\d+$`, u)
		assert.NotContains(t, u, ":5410")
	}
	assert.NotEqual(t, urls[0], urls[1])
	assert.Equal(t, "http://"+explicit, urls[2])
}

// stdioRelayURL starts `serve --stdio` and returns box_health's relay_url.
func stdioRelayURL(t *testing.T, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, append([]string{"serve", "--stdio", "--state-dir", t.TempDir()}, args...)...)
	cmd.Env = append(os.Environ(), "BOXRT_CONFIG={"+backendConfigs["bwrap"]+"}")
	cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"box_health","params":{}}` + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if !assert.NoError(t, err, "stderr: %s", stderr.String()) {
		return ""
	}
	var r struct {
		Result struct {
			RelayURL string `json:"relay_url"`
		} `json:"result"`
	}
	assert.NoError(t, json.Unmarshal(out, &r), "%s", out)
	return r.Result.RelayURL
}

// TestCallExitCode: --exit-code exits with the command's exit code (#41
// item 8); without it a command's failure is still exit status 0.
func TestCallExitCode(t *testing.T) {
	p := Start(t, Options{Config: "{" + backendConfigs["bwrap"] + "}"})
	env := []string{"BOXRT_STATE_DIR=" + p.State}
	url := "ws://" + p.Addr
	tests := []struct {
		params string
		flag   bool
		want   int
	}{
		{`{"session_id":"ec","cmd":"exit 7"}`, true, 7},
		{`{"session_id":"ec","cmd":"exit 7"}`, false, 0},
		{`{"session_id":"ec","cmd":"true"}`, true, 0},
		{`{"session_id":"ec","cmd":"exit 5","stream":true}`, true, 5},
		{`{"session_id":"ec","cmd":"sleep 5","timeout_sec":1}`, true, 124},
	}
	for _, tt := range tests {
		args := []string{"box_exec", tt.params, "--url", url}
		if tt.flag {
			args = append(args, "--exit-code")
		}
		stdout, stderr, code := runCall(t, env, "", args...)
		assert.Equal(t, tt.want, code, "%q: %s", args, stderr)
		assert.Contains(t, stdout, `"status"`, "the result is printed: %q", args)
	}
	_, _, code := runCall(t, env, "", "box_get_session", `{"session_id":"nope"}`, "--url", url, "--exit-code")
	assert.Equal(t, 1, code, "a failed call is still 1")
}

// TestExecCommand: boxrt exec streams stdout and stderr apart and exits
// with the command's exit code; several words arrive as given.
func TestExecCommand(t *testing.T) {
	p := Start(t, Options{Config: "{" + backendConfigs["bwrap"] + "}"})
	env := []string{"BOXRT_STATE_DIR=" + p.State}
	url := "ws://" + p.Addr
	run := func(args ...string) (string, string, int) {
		return runBin(t, env, append([]string{"exec", "ex", "--url", url}, args...)...)
	}
	stdout, stderr, code := run("--", "sh -c 'echo out; echo err >&2; exit 3'")
	assert.Equal(t, 3, code)
	assert.Equal(t, "out\n", stdout)
	assert.Equal(t, "err\n", stderr)

	stdout, _, code = run("--", "printf", "%s|", "a b", "c'd", "$HOME")
	assert.Equal(t, 0, code)
	assert.Equal(t, "a b|c'd|$HOME|", stdout)

	stdout, _, code = run("--env", "GREETING=hi there", "--workdir", "/tmp", "--", "echo $GREETING; pwd")
	assert.Equal(t, 0, code)
	assert.Equal(t, "hi there\n/tmp\n", stdout)

	_, _, code = run("--timeout", "1s", "--", "sleep 10")
	assert.Equal(t, 124, code)

	_, stderr, code = runBin(t, env, "exec", "ex", "--url", "ws://"+freeAddr(t), "--", "true")
	assert.Equal(t, 125, code, "no runtime: %s", stderr)
	assert.Contains(t, stderr, "BoxRuntimeUnavailableError")

	_, stderr, code = runBin(t, env, "exec", "ex", "--url", url)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "want SESSION -- CMD")

	stdout, stderr, code = runBin(t, nil, "exec", "sp", "--spawn", "--", "echo", "spawned")
	assert.Equal(t, 0, code, stderr)
	assert.Equal(t, "spawned\n", stdout)
}

// TestSessionsCommand lists the sessions with state, backend and age.
func TestSessionsCommand(t *testing.T) {
	p := Start(t, Options{Config: "{" + backendConfigs["bwrap"] + "}"})
	env := []string{"BOXRT_STATE_DIR=" + p.State}
	url := "ws://" + p.Addr
	stdout, stderr, code := runBin(t, env, "sessions", "--url", url)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "SESSION  STATE  BACKEND  AGE  IDLE  IMAGE\n", stdout)

	for _, id := range []string{"one", "two"} {
		_, stderr, code = runBin(t, env, "exec", id, "--url", url, "--", "true")
		require.Equal(t, 0, code, stderr)
	}
	stdout, _, code = runBin(t, env, "sessions", "--url", url)
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 3, stdout)
	assert.Regexp(t, `^one\s+running\s+bwrap\s+\d+s\s+\d+s\s`, lines[1])
	assert.Regexp(t, `^two\s+running\s+bwrap\s`, lines[2])

	stdout, _, code = runBin(t, env, "sessions", "--json", "--url", url)
	require.Equal(t, 0, code)
	var r struct {
		Sessions []map[string]any `json:"sessions"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	assert.Len(t, r.Sessions, 2)
}

// TestCpHelpSaysWhenProgressShows: the help text and the flag list agree
// (#41 item 8).
func TestCpHelpSaysWhenProgressShows(t *testing.T) {
	stdout, _, code := runBin(t, nil, "cp", "--help")
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, "(default: on when stderr is a terminal)")
	assert.NotRegexp(t, `--progress.*default: false`, stdout)
}
