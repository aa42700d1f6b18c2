package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/reconnect"
	"github.com/coder/websocket"
)

// Scenario 5 (see hook.go): how long a host is without its runtime.
//
//   - respawn: the spawned child is SIGKILLed; time until the first call
//     through reconnect.Client succeeds again (death noticed, child reaped,
//     new child spawned, __ping + OnConnect handshake, the call itself).
//     Baseline: the floor for the same work, a fresh `serve --stdio` spawn
//     answering its first __ping, with no client around it.
//   - restart: a `serve --listen` runtime is stopped (SIGTERM) and started
//     again on the same port; time from the SIGTERM until the first call
//     through a dialed reconnect.Client succeeds. Baseline: the same
//     restart with a raw WebSocket dial + __ping polled every 10 ms.
//
// Each cycle first lets the link live past the initial backoff (3 s by
// default), so the client takes its immediate-reconnect path, as after a
// crash in production; a link that dies younger waits the backoff.

func init() { reconnectHook = benchReconnect }

func benchReconnect(ctx context.Context, env ReconnectEnv) ([]ReconnectCase, error) {
	r := &reconnBench{env: env}
	respawn := ReconnectCase{
		Case:      "respawn (child SIGKILLed) → first call",
		Label:     "reconnect.Client, spawn mode, defaults",
		BaseLabel: "fresh serve --stdio spawn → first __ping (no client)",
		Note: "Respawn: from SIGKILL of the child to the first successful __ping through the client " +
			"(exit noticed, old child reaped, new child spawned, __ping + OnConnect box_init, then the call). " +
			"The link had lived ≥ 3 s, so the client respawned at once; a child that dies within 3 s of its handshake waits 3 s ± 20 % first.",
	}
	restart := ReconnectCase{
		Case:      "runtime restart (dial) → first call",
		Label:     "reconnect.Client, dial mode, defaults (backoff 3 s ± 20 %)",
		BaseLabel: "raw dial + __ping polled every 10 ms",
		Note: "Restart: from SIGTERM of a `serve --listen` runtime, which is started again on the same port as soon as it exits, " +
			"to the first successful call. With default options the client's immediate attempt meets a closed port and the " +
			"next one follows the 3 s ± 20 % backoff, so this row measures the backoff policy, not boxrt.",
	}
	restartFast := ReconnectCase{
		Case:      "runtime restart (dial) → first call, short backoff",
		Label:     "reconnect.Client, dial mode, WithBackoff(100ms, 2s)",
		BaseLabel: "raw dial + __ping polled every 10 ms",
		Note:      "The same restart with WithBackoff(100ms, 2s): what the client adds when the policy allows quick retries.",
	}
	var errs []error
	for rep := 0; rep < env.Reps && ctx.Err() == nil; rep++ {
		env.Logf("reconnect: repetition %d/%d", rep+1, env.Reps)
		run, err := r.respawnRun(ctx, rep, env.Cycles)
		respawn.Runs = append(respawn.Runs, run)
		errs = append(errs, err)
		base, err := r.spawnBaseline(ctx, rep, env.Cycles)
		respawn.BaseRuns = append(respawn.BaseRuns, base)
		errs = append(errs, err)

		// The default-backoff restart costs ~7 s a cycle and is mostly
		// the backoff itself; five cycles are enough for its median.
		run, err = r.restartRun(ctx, rep, min(env.Cycles, 5), nil)
		restart.Runs = append(restart.Runs, run)
		errs = append(errs, err)
		run, err = r.restartRun(ctx, rep, env.Cycles, []reconnect.Option{reconnect.WithBackoff(100*time.Millisecond, 2*time.Second)})
		restartFast.Runs = append(restartFast.Runs, run)
		errs = append(errs, err)
		base, err = r.restartBaseline(ctx, rep, env.Cycles)
		restart.BaseRuns = append(restart.BaseRuns, base)
		restartFast.BaseRuns = append(restartFast.BaseRuns, base)
		errs = append(errs, err)
	}
	for _, c := range []ReconnectCase{respawn, restart, restartFast} {
		env.Logf("reconnect: %s: median %v (baseline median %v)", c.Case, reconnMedian(c.Runs), reconnMedian(c.BaseRuns))
	}
	return []ReconnectCase{respawn, restart, restartFast}, errors.Join(errs...)
}

type reconnBench struct{ env ReconnectEnv }

func (r *reconnBench) logFile(name string) (*os.File, error) {
	return os.OpenFile(filepath.Join(r.env.WorkDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}

// connectedAt tracks when the client's current link came up.
type reconnUptime struct {
	mu sync.Mutex
	at time.Time
}

func (u *reconnUptime) hook(s reconnect.State, _ error) {
	if s == reconnect.StateConnected {
		u.mu.Lock()
		u.at = time.Now()
		u.mu.Unlock()
	}
}

// waitStable sleeps until the link has lived past the initial backoff.
func (u *reconnUptime) waitStable(ctx context.Context, stable time.Duration) {
	u.mu.Lock()
	wait := time.Until(u.at.Add(stable + 100*time.Millisecond))
	u.mu.Unlock()
	if wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
}

// firstCall retries __ping until one succeeds: the first attempt may still
// go out on the dying link and fail with a retryable error.
func reconnFirstCall(ctx context.Context, c *reconnect.Client) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := c.Call(cctx, "__ping", struct{}{}, nil)
		cancel()
		var e *reconnect.Error
		if err == nil || !errors.As(err, &e) || !e.Retryable || ctx.Err() != nil {
			return err
		}
	}
}

func (r *reconnBench) respawnRun(ctx context.Context, rep, cycles int) ([]time.Duration, error) {
	logf, err := r.logFile(fmt.Sprintf("reconnect-respawn-%d", rep))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	up := &reconnUptime{}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	c, err := reconnect.Spawn(sctx,
		reconnect.WithCommand(r.env.BoxrtBin, "serve", "--stdio", "--listen", "", "--state-dir", filepath.Join(r.env.WorkDir, "reconnect-respawn-state")),
		reconnect.WithStderr(logf),
		reconnect.WithOnStateChange(up.hook),
		reconnect.WithOnConnect(func(ctx context.Context, c reconnect.Caller) error {
			return c.Call(ctx, "box_init", map[string]any{}, nil)
		}))
	if err != nil {
		return nil, fmt.Errorf("respawn: %w", err)
	}
	defer c.Close()
	var samples []time.Duration
	for i := 0; i < cycles && ctx.Err() == nil; i++ {
		up.waitStable(ctx, reconnect.DefaultBackoffInitial)
		pid := c.Status().PID
		if pid == 0 {
			return samples, errors.New("respawn: client not connected")
		}
		t0 := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return samples, err
		}
		if err := reconnFirstCall(ctx, c); err != nil {
			return samples, fmt.Errorf("respawn: first call: %w", err)
		}
		samples = append(samples, time.Since(t0))
	}
	return samples, nil
}

// spawnBaseline: exec serve --stdio, write __ping, read the answer.
func (r *reconnBench) spawnBaseline(ctx context.Context, rep, cycles int) ([]time.Duration, error) {
	logf, err := r.logFile(fmt.Sprintf("reconnect-spawn-baseline-%d", rep))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	var samples []time.Duration
	for i := 0; i < cycles && ctx.Err() == nil; i++ {
		t0 := time.Now()
		cmd := exec.CommandContext(ctx, r.env.BoxrtBin, "serve", "--stdio", "--listen", "", "--state-dir", filepath.Join(r.env.WorkDir, "reconnect-baseline-state"))
		cmd.Stderr = logf
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return samples, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return samples, err
		}
		if err := cmd.Start(); err != nil {
			return samples, err
		}
		_, err = stdin.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"__ping","params":{}}` + "\n"))
		var line []byte
		if err == nil {
			line, err = bufio.NewReader(stdout).ReadBytes('\n')
		}
		d := time.Since(t0)
		_ = stdin.Close()
		_ = cmd.Wait()
		if err != nil {
			return samples, fmt.Errorf("spawn baseline: %w", err)
		}
		if err := reconnCheckPing(line); err != nil {
			return samples, err
		}
		samples = append(samples, d)
	}
	return samples, nil
}

func reconnCheckPing(line []byte) error {
	var resp struct {
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(line, &resp); err != nil || resp.Error != nil || resp.Result == nil {
		return fmt.Errorf("unexpected __ping answer %q", line)
	}
	return nil
}

// reconnServe is one `boxrt serve --listen ADDR`.
type reconnServe struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (r *reconnBench) startServe(ctx context.Context, addr, name string) (*reconnServe, error) {
	logf, err := r.logFile(name)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, r.env.BoxrtBin, "serve", "--listen", addr, "--state-dir", filepath.Join(r.env.WorkDir, name+"-state"))
	cmd.Env = append(os.Environ(), "BOXRT_CONTROL_TOKEN="+r.env.Token)
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, err
	}
	s := &reconnServe{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(s.done) }()
	return s, nil
}

// stop sends SIGTERM and waits for the exit (SIGKILL after 15 s).
func (s *reconnServe) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func reconnFreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// rawPing dials /rpc/ws once and sends one __ping.
func (r *reconnBench) rawPing(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	h := http.Header{}
	if r.env.Token != "" {
		h.Set("Authorization", "Bearer "+r.env.Token)
	}
	c, resp, err := websocket.Dial(ctx, "ws://"+addr+"/rpc/ws", &websocket.DialOptions{HTTPHeader: h})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		return err
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","id":1,"method":"__ping","params":{}}`)); err != nil {
		return err
	}
	_, data, err := c.Read(ctx)
	if err != nil {
		return err
	}
	return reconnCheckPing(data)
}

// restartRun measures SIGTERM → restart → first successful client call.
func (r *reconnBench) restartRun(ctx context.Context, rep, cycles int, extra []reconnect.Option) ([]time.Duration, error) {
	addr, err := reconnFreeAddr()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("reconnect-restart-%d-%d", rep, len(extra))
	srv, err := r.startServe(ctx, addr, name)
	if err != nil {
		return nil, err
	}
	defer func() { srv.stop() }()
	up := &reconnUptime{}
	dctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	opts := append([]reconnect.Option{reconnect.WithToken(r.env.Token), reconnect.WithOnStateChange(up.hook)}, extra...)
	// The listener may not be up yet; Dial retries with backoff.
	c, err := reconnect.Dial(dctx, "ws://"+addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("restart: dial: %w", err)
	}
	defer c.Close()
	stable := reconnect.DefaultBackoffInitial
	if len(extra) > 0 {
		stable = 100 * time.Millisecond
	}
	var samples []time.Duration
	for i := 0; i < cycles && ctx.Err() == nil; i++ {
		up.waitStable(ctx, stable)
		t0 := time.Now()
		srv.stop()
		if srv, err = r.startServe(ctx, addr, name); err != nil {
			return samples, err
		}
		if err := reconnFirstCall(ctx, c); err != nil {
			return samples, fmt.Errorf("restart: first call: %w", err)
		}
		samples = append(samples, time.Since(t0))
	}
	return samples, nil
}

// restartBaseline measures SIGTERM → restart → first raw __ping, polling.
func (r *reconnBench) restartBaseline(ctx context.Context, rep, cycles int) ([]time.Duration, error) {
	addr, err := reconnFreeAddr()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("reconnect-restart-baseline-%d", rep)
	srv, err := r.startServe(ctx, addr, name)
	if err != nil {
		return nil, err
	}
	defer func() { srv.stop() }()
	poll := func() error {
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := r.rawPing(ctx, addr)
			if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := poll(); err != nil {
		return nil, fmt.Errorf("restart baseline: %w", err)
	}
	var samples []time.Duration
	for i := 0; i < cycles && ctx.Err() == nil; i++ {
		t0 := time.Now()
		srv.stop()
		if srv, err = r.startServe(ctx, addr, name); err != nil {
			return samples, err
		}
		if err := poll(); err != nil {
			return samples, fmt.Errorf("restart baseline: %w", err)
		}
		samples = append(samples, time.Since(t0))
	}
	return samples, nil
}

func reconnMedian(runs [][]time.Duration) time.Duration {
	var all []time.Duration
	for _, r := range runs {
		all = append(all, r...)
	}
	if len(all) == 0 {
		return 0
	}
	return medianDur(all)
}
