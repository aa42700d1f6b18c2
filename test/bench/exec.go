package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
)

// execResult is the part of box_exec's result the harness checks.
type execResult struct {
	Status   string `json:"status"`
	ExitCode *int   `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// boxExec runs cmd in a session and fails unless it exited 0.
func boxExec(ctx context.Context, c *rpcClient, sessionID, cmd string) (execResult, error) {
	var r execResult
	params := map[string]any{"session_id": sessionID, "cmd": cmd}
	if err := c.CallInto(ctx, "box_exec", params, &r); err != nil {
		return r, err
	}
	if r.ExitCode == nil || *r.ExitCode != 0 {
		code := "none"
		if r.ExitCode != nil {
			code = fmt.Sprint(*r.ExitCode)
		}
		return r, fmt.Errorf("box_exec %q: status %s, exit code %s, stderr %q", cmd, r.Status, code, truncate(r.Stderr, 200))
	}
	return r, nil
}

func deleteSession(ctx context.Context, c *rpcClient, sessionID string) error {
	_, err := c.Call(ctx, "box_delete_session", map[string]string{"session_id": sessionID})
	return err
}

// backendConfig is BOXRT_CONFIG for a backend.
func (b *bench) backendConfig(backend string, limits map[string]any) string {
	cfg := map[string]any{"backend": backend}
	if backend == "docker" {
		cfg["docker"] = map[string]any{"image": b.cfg.image}
	}
	if limits != nil {
		cfg["limits"] = limits
	}
	out, _ := json.Marshal(cfg)
	return string(out)
}

// startBackend starts boxrt over stdio with one backend and checks that the
// backend is really the one selected.
func (b *bench) startBackend(ctx context.Context, name, backend string, listen bool, limits map[string]any) (*boxrtProc, error) {
	o := boxrtOpts{Name: name, Stdio: true, Listen: listen, Config: b.backendConfig(backend, limits)}
	if listen {
		o.Token = b.token
	}
	p, err := b.startBoxrt(ctx, o)
	if err != nil {
		return nil, err
	}
	if err := b.checkBackend(ctx, p, backend); err != nil {
		return nil, err
	}
	return p, nil
}

// checkBackend records p's instance id (for the final cleanup check) and
// makes sure the backend selected is the one asked for; it stops p if not.
func (b *bench) checkBackend(ctx context.Context, p *boxrtProc, backend string) error {
	var st struct {
		Backend struct {
			Name      *string `json:"name"`
			Available bool    `json:"available"`
			Error     string  `json:"error"`
		} `json:"backend"`
		InstanceID string `json:"instance_id"`
	}
	if err := p.rpc.CallInto(ctx, "box_status", nil, &st); err != nil {
		p.stop(10 * time.Second)
		return fmt.Errorf("box_status: %w", err)
	}
	b.instances[st.InstanceID] = true
	if !st.Backend.Available || st.Backend.Name == nil || *st.Backend.Name != backend {
		p.stop(10 * time.Second)
		got := "none"
		if st.Backend.Name != nil {
			got = *st.Backend.Name
		}
		return fmt.Errorf("backend %s not available in this boxrt build (selected: %s; %s)", backend, got, truncate(st.Backend.Error, 300))
	}
	return nil
}

func (b *bench) scenarioExec(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "Warm exec of `true`"}
	sc.Intro = fmt.Sprintf(`One session is created and warmed (3 execs) per run, then `+"`box_exec {\"cmd\":\"true\"}`"+` is called
sequentially over stdio: %d times per run for docker, %d for bwrap.
Latency is the whole call as a host sees it: request written → answer with the exit code read.
**Baselines** run interleaved with boxrt, one call each in turn (in an order shuffled every round), so a machine
whose speed drifts during the run slows boxrt and its baseline alike. On docker every call of every case comes after
%s of idle time, as a host's commands come after an agent's turn: what a call leaves running (boxrt starts the exec
the session's next command will run in; a raw exec's kill watcher cleans up) is done before the next one is timed.
The back-to-back row is boxrt's call right after another one on the same session, with that exec still starting:
- *raw Engine API*: from Go with github.com/docker/docker/client, in the very container of boxrt's session (same image,
  hardening and limits): ContainerExecCreate(`+"`sh -c true`"+`) → ContainerExecAttach (which is the start: POST
  /exec/{id}/start, hijacked) → read both streams to EOF → ContainerExecInspect. This is the floor for a docker backend.
  The same with `+"`sh -lc true`"+` is the floor of boxrt's semantics: every command runs in a login shell, as the
  reference's `+"`docker exec … sh -lc`"+` does (Debian's /etc/profile alone runs `+"`id -u`"+`). The same with boxrt's own
  wrapper (`+"`docker.ExecCommand`"+`: the login shell plus the kill watcher forked before the command, stdin attached for
  the watcher) is the floor of this design: what boxrt adds above it is its own Go code and the JSON-RPC round trip.
- *docker exec CLI*: `+"`docker exec <that container> sh -c true`"+` — what the reference Python runtime spawns per
  call — every %d calls (%d per run; it is slow).
- *direct bwrap*: the very bwrap command boxrt runs for the exec (`+"`bwrap.BareCommand`"+`: the same options — every
  namespace, a user namespace of its own with --disable-userns, the host's system directories and /etc essentials
  read-only, /proc hardening, --cap-drop ALL, the seccomp filter on a memfd, options through --args on a memfd — run as
  the unprivileged sandbox user, `+"`/bin/sh -lc true`"+`), spawned from Go with workspace, /tmp and /home on plain
  directories: no session, stage, cgroup or bookkeeping — the floor for a bwrap backend that spawns a sandbox per exec.
- *minimal bwrap spawn*: `+"`bwrap "+strings.Join(minimalBwrapArgs, " ")+" /bin/true`"+` as root — the cheapest spawn that
  still makes every namespace, none of boxrt's hardening: the yardstick of a session that is entered, not spawned.`,
		cfg.execNDocker, cfg.execNBwrap, fmtDur(dockerExecIdle), cliEvery(cfg), cfg.execNDocker/cliEvery(cfg))

	boxDocker := newMeasure("boxrt docker")
	boxDockerB2B := newMeasure("boxrt docker, back to back")
	raw := newMeasure("raw Engine API exec")
	rawLogin := newMeasure("raw Engine API exec, login shell")
	rawWrapper := newMeasure("raw Engine API exec of boxrt's wrapper")
	cli := newMeasure("`docker exec` CLI")
	boxBwrap := newMeasure("boxrt bwrap")
	direct := newMeasure("direct bwrap spawn")
	minimal := newMeasure("minimal bwrap spawn of /bin/true")
	sc.Rows = []Row{
		{Case: "docker backend vs Engine API floor", Boxrt: boxDocker, Base: raw},
		{Case: "docker backend vs Engine API floor, login shell", Boxrt: boxDocker, Base: rawLogin},
		{Case: "docker backend vs Engine API floor, boxrt's wrapper", Boxrt: boxDocker, Base: rawWrapper},
		{Case: "docker backend, back to back, vs Engine API floor", Boxrt: boxDockerB2B, Base: raw},
		{Case: "docker backend vs docker CLI", Boxrt: boxDocker, Base: cli},
		{Case: "bwrap backend vs bare bwrap", Boxrt: boxBwrap, Base: direct},
		{Case: "bwrap backend vs minimal bwrap spawn", Boxrt: boxBwrap, Base: minimal},
	}

	if !b.wantBackend("docker") {
		boxDocker.Unavailable, boxDockerB2B.Unavailable, raw.Unavailable, rawLogin.Unavailable, rawWrapper.Unavailable, cli.Unavailable = skippedBackend, skippedBackend, skippedBackend, skippedBackend, skippedBackend, skippedBackend
	}
	if !b.wantBackend("bwrap") {
		boxBwrap.Unavailable, direct.Unavailable, minimal.Unavailable = skippedBackend, skippedBackend, skippedBackend
	}
	dcli, err := newDockerClient()
	if err != nil {
		raw.Unavailable = "no Docker engine: " + err.Error()
		rawLogin.Unavailable, rawWrapper.Unavailable, cli.Unavailable = raw.Unavailable, raw.Unavailable, raw.Unavailable
	} else {
		defer dcli.Close()
	}
	ws := filepath.Join(b.workDir, "bwrap-floor")
	_ = os.MkdirAll(ws, 0o755)

	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		if boxDocker.Unavailable == "" {
			b.boxExecRun(ctx, boxDocker, "docker", cfg.execNDocker, dockerExecIdle, func(sid string, call func() error) ([]timedOp, error) {
				b2b := timedOp{m: boxDockerB2B, op: call, before: func() { _ = call() }}
				if raw.Unavailable != "" {
					return []timedOp{b2b}, nil
				}
				id, err := sessionContainer(ctx, dcli, sid)
				if err != nil {
					return nil, err
				}
				floor := &dockerFloor{cli: dcli, id: id}
				wrapped := 0
				for i := 0; i < 3; i++ { // warm
					_, _ = floor.exec(ctx, []string{"sh", "-c", "true"})
				}
				return []timedOp{
					b2b,
					{m: raw, op: func() error {
						_, err := floor.exec(ctx, []string{"sh", "-c", "true"})
						return err
					}},
					{m: rawLogin, op: func() error {
						_, err := floor.exec(ctx, []string{"sh", "-lc", "true"})
						return err
					}},
					{m: rawWrapper, op: func() error {
						wrapped++
						pidFile := fmt.Sprintf("/tmp/.boxrt-exec-bench%d.pid", wrapped)
						_, err := floor.execWrapped(ctx, docker.ExecCommand(backends.DefaultMountPath, "true", pidFile))
						return err
					}},
					{m: cli, every: cliEvery(cfg), op: func() error {
						_, err := runCmd(ctx, "docker", "exec", id, "sh", "-c", "true")
						return err
					}},
				}, nil
			})
		}
		if boxBwrap.Unavailable == "" {
			b.boxExecRun(ctx, boxBwrap, "bwrap", cfg.execNBwrap, 0, func(string, func() error) ([]timedOp, error) {
				if direct.Unavailable != "" {
					return nil, nil
				}
				return []timedOp{{m: direct, op: func() error {
					_, err := runBwrap(ctx, ws, "/bin/sh", "-lc", "true")
					return err
				}}, {m: minimal, op: func() error {
					_, err := runMinimalBwrap(ctx, "/bin/true")
					return err
				}}}, nil
			})
		}
		b.logf("exec rep %d: boxrt docker %s, raw %s, cli %s, boxrt bwrap %s, bwrap %s", rep+1,
			lastP50(boxDocker), lastP50(raw), lastP50(cli), lastP50(boxBwrap), lastP50(direct))
	}
	sc.Goals = execGoals(execMeasures{boxDocker: boxDocker, boxDockerB2B: boxDockerB2B, raw: raw, rawLogin: rawLogin,
		rawWrapper: rawWrapper, cli: cli, boxBwrap: boxBwrap, direct: direct, minimal: minimal})
	sc.Breakdown = whereTimeGoesDockerExec
	if b.wantBackend("bwrap") {
		sc.Notes = append(sc.Notes, bwrapCostNotes...)
	}
	return sc
}

// execMeasures are the warm-exec scenario's cases, for its goals.
type execMeasures struct {
	boxDocker, boxDockerB2B, raw, rawLogin, rawWrapper, cli *Measure
	boxBwrap, direct, minimal                               *Measure
}

// execGoals states the warm-exec scenario's goals: the docker backend
// against the Engine API and the CLI, the bwrap backend against a bwrap
// spawn (issue 37: a session that is entered, not spawned, beats the
// cheapest spawn by far).
func execGoals(m execMeasures) []Goal {
	boxDocker, boxDockerB2B, raw, rawLogin, rawWrapper, cli := m.boxDocker, m.boxDockerB2B, m.raw, m.rawLogin, m.rawWrapper, m.cli
	boxBwrap, direct := m.boxBwrap, m.direct
	g1 := Goal{Text: "boxrt docker warm exec within 1.05× of the raw Engine API (p50)"}
	g2 := Goal{Text: "boxrt docker warm exec at least 3× faster than the `docker exec` CLI (p50)"}
	if boxDocker.ok() && raw.ok() {
		r := ratio(float64(boxDocker.P50()), float64(raw.P50()))
		g1.Measured = fmt.Sprintf("%s vs %s = %.2f×", fmtDur(boxDocker.P50()), fmtDur(raw.P50()), r)
		if rawLogin.ok() {
			g1.Measured += fmt.Sprintf("; the raw exec in a login shell (`sh -lc true`, what every boxrt command runs in) took %s: boxrt is %.2f× that",
				fmtDur(rawLogin.P50()), ratio(float64(boxDocker.P50()), float64(rawLogin.P50())))
		}
		if rawWrapper.ok() {
			g1.Measured += fmt.Sprintf("; the raw exec of boxrt's own wrapper (login shell and kill watcher: the floor of this design) took %s = %.2f× the raw exec: boxrt is %.2f× that",
				fmtDur(rawWrapper.P50()), ratio(float64(rawWrapper.P50()), float64(raw.P50())), ratio(float64(boxDocker.P50()), float64(rawWrapper.P50())))
		}
		if boxDockerB2B.ok() {
			g1.Measured += fmt.Sprintf("; back to back (the call right after another, the exec it runs in still starting) %s = %.2f× the raw exec",
				fmtDur(boxDockerB2B.P50()), ratio(float64(boxDockerB2B.P50()), float64(raw.P50())))
		}
		g1.Met = boolp(r <= 1.05)
	} else {
		g1.Measured = "not measured"
	}
	if boxDocker.ok() && cli.ok() {
		r := ratio(float64(cli.P50()), float64(boxDocker.P50()))
		g2.Measured = fmt.Sprintf("CLI %s vs boxrt %s = %.2f× faster", fmtDur(cli.P50()), fmtDur(boxDocker.P50()), r)
		g2.Met = boolp(r >= 3)
		if raw.ok() {
			g2.Measured += fmt.Sprintf("; on this machine even the raw Engine API floor is only %.2f× faster than the CLI (%s vs %s), which bounds what any API client can reach",
				ratio(float64(cli.P50()), float64(raw.P50())), fmtDur(raw.P50()), fmtDur(cli.P50()))
		}
	} else {
		g2.Measured = "not measured"
	}
	g3 := ratioGoal("boxrt bwrap warm exec within 1.3× of a bare bwrap spawn with the same flags (p50)", boxBwrap, direct, 1.3)
	return []Goal{g1, g2, g3, ratioGoal("boxrt bwrap warm exec p50 ≤ 0.35× a minimal bare bwrap spawn of /bin/true", boxBwrap, m.minimal, 0.35),
		ratioGoal("boxrt docker back-to-back warm exec p50 ≤ 0.2× the `docker exec` CLI", boxDockerB2B, cli, 0.2)}
}

// ratioGoal is the goal "a's p50 is at most limit times b's".
func ratioGoal(text string, a, b *Measure, limit float64) Goal {
	g := Goal{Text: text, Measured: "not measured"}
	if a.ok() && b.ok() {
		r := ratio(float64(a.P50()), float64(b.P50()))
		g.Measured = fmt.Sprintf("%s vs %s = %.2f×", fmtDur(a.P50()), fmtDur(b.P50()), r)
		g.Met = boolp(r <= limit)
	}
	return g
}

// cliEvery is how often (in calls) the slow docker CLI baseline runs.
func cliEvery(cfg config) int { return max(cfg.execNDocker/max(cfg.execNCLI, 1), 1) }

// dockerExecIdle is the idle time before each call of the docker warm exec
// run: more than boxrt's start of the session's next exec takes.
const dockerExecIdle = 100 * time.Millisecond

// boxExecRun is one run: a fresh boxrt, one warmed session, n execs of
// `true` through it, interleaved with the baselines made for the session
// (call is one such exec), every call after idle time (unless its case
// has a before of its own).
func (b *bench) boxExecRun(ctx context.Context, m *Measure, backend string, n int, idle time.Duration, baselines func(sessionID string, call func() error) ([]timedOp, error)) {
	p, err := b.startBackend(ctx, "exec-"+backend, backend, false, nil)
	if err != nil {
		m.Unavailable = err.Error()
		return
	}
	defer p.stop(30 * time.Second)
	sid := fmt.Sprintf("bench-exec-%s-%d", backend, procSeq.Load())
	for i := 0; i < 4; i++ { // creates the session, then warms it
		if _, err := boxExec(ctx, p.rpc, sid, "true"); err != nil {
			m.fail(err)
			return
		}
	}
	call := func() error {
		_, err := boxExec(ctx, p.rpc, sid, "true")
		return err
	}
	base, err := baselines(sid, call)
	if err != nil {
		m.fail(fmt.Errorf("baselines: %w", err))
		return
	}
	ops := append([]timedOp{{m: m, op: call}}, base...)
	for i := range ops {
		if idle > 0 && ops[i].before == nil {
			ops[i].before = func() { time.Sleep(idle) }
		}
	}
	timeInterleaved(ctx, n, ops...)
	if err := deleteSession(ctx, p.rpc, sid); err != nil {
		m.fail(fmt.Errorf("delete session: %w", err))
	}
}

// sessionContainer is the container of boxrt's session sid.
func sessionContainer(ctx context.Context, cli *client.Client, sid string) (string, error) {
	list, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", docker.LabelSession+"="+sid))})
	if err != nil {
		return "", err
	}
	if len(list) != 1 {
		return "", fmt.Errorf("%d containers carry %s=%s, want 1", len(list), docker.LabelSession, sid)
	}
	return list[0].ID, nil
}
