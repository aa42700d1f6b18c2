package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// boxrtOpts says how to start one boxrt.
type boxrtOpts struct {
	Name   string   // for the log file name
	Stdio  bool     // serve --stdio (else WebSocket only)
	Listen bool     // run the HTTP listener (relay, /rpc/ws) on 127.0.0.1:0
	Config string   // BOXRT_CONFIG
	Token  string   // BOXRT_CONTROL_TOKEN ("" = none)
	Env    []string // extra environment (DOCKER_HOST=…)
	// DirectClient: the stdio client reads its own answers, one call at a
	// time (newDirectClient), instead of multiplexing.
	DirectClient bool
	// OneCPU: boxrt runs on CPU 0 only (see command).
	OneCPU bool
	// MCP: boxrt mcp (MCP on stdio) instead of serve; rpc is its
	// connection, initialized (mcpInitialize).
	MCP bool
	// Args are more serve flags.
	Args []string
}

// boxrtProc is a running boxrt.
type boxrtProc struct {
	cmd      *exec.Cmd
	opts     boxrtOpts
	rpc      *rpcClient // the stdio control connection (nil without --stdio)
	addr     string     // host:port of the HTTP listener
	stateDir string
	logPath  string
	exited   chan struct{}
	exitErr  error
}

var procSeq atomic.Int64

// startBoxrt spawns the binary and, with --stdio, waits until __ping
// answers; with a listener, until the log names the listening address.
func (b *bench) startBoxrt(ctx context.Context, o boxrtOpts) (*boxrtProc, error) {
	n := procSeq.Add(1)
	stateDir := filepath.Join(b.workDir, fmt.Sprintf("state-%03d-%s", n, o.Name))
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	logPath := filepath.Join(b.workDir, fmt.Sprintf("boxrt-%03d-%s.log", n, o.Name))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := serveArgs(o, stateDir)
	cmd := command(o.OneCPU, b.boxrtBin, args...)
	cmd.Env = filteredEnv("BOXRT_CONFIG", "LANGBOT_BOX_CONFIG", "BOXRT_CONTROL_TOKEN", "LANGBOT_BOX_CONTROL_TOKEN")
	if o.Config != "" {
		cmd.Env = append(cmd.Env, "BOXRT_CONFIG="+o.Config)
	}
	if o.Token != "" {
		cmd.Env = append(cmd.Env, "BOXRT_CONTROL_TOKEN="+o.Token)
	}
	cmd.Env = append(cmd.Env, o.Env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	p := &boxrtProc{cmd: cmd, opts: o, stateDir: stateDir, logPath: logPath, exited: make(chan struct{})}
	var stdin io.WriteCloser
	var stdout io.ReadCloser
	if o.Stdio {
		if stdin, err = cmd.StdinPipe(); err != nil {
			logFile.Close()
			return nil, err
		}
		if stdout, err = cmd.StdoutPipe(); err != nil {
			logFile.Close()
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start boxrt: %w", err)
	}
	addrCh := make(chan string, 1)
	var once sync.Once
	go func() {
		defer logFile.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Bytes()
			logFile.Write(append(line, '\n'))
			if o.Listen && strings.Contains(string(line), "boxrt serving") {
				var ev struct {
					Listen string `json:"listen"`
				}
				if json.Unmarshal(line, &ev) == nil && ev.Listen != "" {
					once.Do(func() { addrCh <- strings.TrimPrefix(ev.Listen, "http://") })
				}
			}
		}
	}()
	go func() {
		p.exitErr = cmd.Wait()
		close(p.exited)
	}()
	if o.Stdio {
		p.rpc = newClient(newLineTransport(stdin, stdout), o.DirectClient)
	}
	if o.Listen {
		select {
		case p.addr = <-addrCh:
		case <-p.exited:
			return nil, fmt.Errorf("boxrt exited at start (%v); log %s:\n%s", p.exitErr, logPath, tail(logPath, 20))
		case <-time.After(20 * time.Second):
			p.kill()
			return nil, fmt.Errorf("boxrt did not log its listen address in 20 s; log %s", logPath)
		}
	}
	if o.Stdio {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := ready(cctx, p); err != nil {
			p.kill()
			return nil, fmt.Errorf("boxrt does not answer: %v; log %s:\n%s", err, logPath, tail(logPath, 20))
		}
	}
	return p, nil
}

// serveArgs are the command line of the boxrt o asks for.
func serveArgs(o boxrtOpts, stateDir string) []string {
	if o.MCP {
		return []string{"mcp", "--state-dir", stateDir}
	}
	args := []string{"serve", "--state-dir", stateDir}
	if o.Stdio {
		args = append(args, "--stdio")
	}
	if o.Listen {
		args = append(args, "--listen", "127.0.0.1:0")
	} else {
		args = append(args, "--listen", "")
	}
	return append(args, o.Args...)
}

// ready waits until the stdio peer answers: __ping, or MCP's handshake.
func ready(ctx context.Context, p *boxrtProc) error {
	if p.opts.MCP {
		return mcpInitialize(ctx, p.rpc)
	}
	_, err := p.rpc.Call(ctx, "__ping", nil)
	return err
}

// pid of the boxrt process.
func (p *boxrtProc) pid() int { return p.cmd.Process.Pid }

// stop shuts boxrt down the way a host does (stdin EOF, else SIGTERM) and
// kills it if it lingers.
func (p *boxrtProc) stop(grace time.Duration) error {
	if p.rpc != nil {
		p.rpc.t.Close()
	} else {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			p.kill()
			return fmt.Errorf("boxrt (pid %d) did not stop; killed", p.pid())
		}
	}
	if p.rpc != nil {
		p.rpc.Close()
	}
	return nil
}

func (p *boxrtProc) kill() {
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
	}
}

// wsURL is the control socket URL.
func (p *boxrtProc) wsURL() string { return "ws://" + p.addr + "/rpc/ws" }

// rssKiB reads VmRSS of a process from /proc.
func rssKiB(pid int) (int64, error) { return statusKiB(pid, "VmRSS:") }

// filteredEnv is os.Environ without the named variables.
func filteredEnv(drop ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, d := range drop {
			if k == d {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
