package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// isolationVariant is one backend/runtime of the isolation matrix.
type isolationVariant struct {
	name    string
	backend string
	docker  map[string]any // docker config beyond the image
	env     []string       // extra environment of boxrt
	warm    *Measure
	cold    *Measure
}

// podmanSocket is where scripts/setup starts Podman's Docker API.
const podmanSocket = "/run/podman/podman.sock"

// scenarioIsolation measures what each isolation costs: the same warm exec
// and create→first output on bwrap, docker with runc, docker with gVisor
// (runsc) and Podman's Docker API (runc), each against docker/runc.
func (b *bench) scenarioIsolation(ctx context.Context) *Scenario {
	cfg := b.cfg
	sc := &Scenario{Title: "Isolation cost: bwrap, runc, gVisor, Podman"}
	sc.Intro = fmt.Sprintf(`The same two operations on every backend and runtime of the isolation matrix, through boxrt over stdio:
*warm exec* (%d sequential `+"`box_exec {\"cmd\":\"true\"}`"+` on one warmed session per run) and *create→first output*
(%d `+"`box_exec {\"cmd\":\"echo hi\"}`"+` on session ids never used before, each deleted afterwards). **Baseline:** docker with
runc (Docker's default runtime), so the ratio is the price of the other isolation. docker/runsc is `+"`docker.runtime: runsc`"+`
(gVisor, ptrace platform, registered by scripts/setup); podman is the docker backend with DOCKER_HOST=unix://%s.`,
		cfg.execNDocker, cfg.coldNDocker, podmanSocket)

	variants := []*isolationVariant{
		{name: "docker/runc", backend: "docker"},
		{name: "docker/runsc", backend: "docker", docker: map[string]any{"runtime": "runsc"}},
		{name: "podman/runc", backend: "docker", env: []string{"DOCKER_HOST=unix://" + podmanSocket}},
		{name: "bwrap", backend: "bwrap"},
	}
	for _, v := range variants {
		v.warm, v.cold = newMeasure(v.name+" warm exec"), newMeasure(v.name+" create→first output")
	}
	base := variants[0]
	for _, v := range variants {
		sc.Rows = append(sc.Rows, Row{Case: v.name + ": warm exec", Boxrt: v.warm, Base: base.warm})
	}
	for _, v := range variants {
		sc.Rows = append(sc.Rows, Row{Case: v.name + ": create→first output", Boxrt: v.cold, Base: base.cold})
	}
	if _, err := os.Stat(podmanSocket); err != nil {
		variants[2].warm.Unavailable, variants[2].cold.Unavailable = "no Podman API socket (scripts/setup starts it)", "no Podman API socket"
	}
	for _, v := range variants {
		if !b.wantBackend(v.backend) {
			v.warm.Unavailable, v.cold.Unavailable = skippedBackend, skippedBackend
		}
	}

	for rep := 0; rep < cfg.reps && ctx.Err() == nil; rep++ {
		for _, v := range variants {
			if v.warm.Unavailable != "" {
				continue
			}
			b.isolationRun(ctx, v, rep)
		}
		b.logf("isolation rep %d: %s", rep+1, func() string {
			s := ""
			for _, v := range variants {
				s += fmt.Sprintf("%s warm %s cold %s; ", v.name, lastP50(v.warm), lastP50(v.cold))
			}
			return s
		}())
	}
	sc.Notes = append(sc.Notes, "Each variant runs its own boxrt per run (started outside the timing); its sessions use the reference defaults "+
		"(network off, read-only rootfs, 512 MB, 128 pids — on gVisor the pids cgroup is scaled for the sentry's threads).")
	return sc
}

// isolationRun starts one boxrt for variant v and measures one run of both
// operations.
func (b *bench) isolationRun(ctx context.Context, v *isolationVariant, rep int) {
	conf := map[string]any{"backend": v.backend}
	if v.backend == "docker" {
		d := map[string]any{"image": b.cfg.image}
		for k, val := range v.docker {
			d[k] = val
		}
		conf["docker"] = d
	}
	raw, _ := json.Marshal(conf)
	p, err := b.startBoxrt(ctx, boxrtOpts{Name: fmt.Sprintf("isolation-%s-%d", sanitize(v.name), rep), Stdio: true, Config: string(raw), Env: v.env})
	if err == nil {
		err = b.checkBackend(ctx, p, v.backend)
	}
	if err != nil {
		v.warm.Unavailable, v.cold.Unavailable = firstLine(err.Error()), firstLine(err.Error())
		return
	}
	defer p.stop(30 * time.Second)

	sid := fmt.Sprintf("bench-iso-warm-%d", rep)
	for i := 0; i < 3; i++ {
		if _, err := boxExec(ctx, p.rpc, sid, "true"); err != nil {
			v.warm.Unavailable, v.cold.Unavailable = "warming: "+firstLine(err.Error()), "warming: "+firstLine(err.Error())
			return
		}
	}
	timeOps(ctx, v.warm, b.cfg.execNDocker, func(int) error {
		_, err := boxExec(ctx, p.rpc, sid, "true")
		return err
	})
	_ = deleteSession(ctx, p.rpc, sid)

	var samples []time.Duration
	var sum time.Duration
	for i := 0; i < b.cfg.coldNDocker && ctx.Err() == nil; i++ {
		id := fmt.Sprintf("bench-iso-cold-%d-%d", rep, i)
		s := time.Now()
		r, err := boxExec(ctx, p.rpc, id, "echo hi")
		d := time.Since(s)
		if err == nil {
			err = expectOut(r.Stdout, "hi\n")
		}
		if err != nil {
			v.cold.fail(err)
		} else {
			samples = append(samples, d)
			sum += d
		}
		_ = deleteSession(ctx, p.rpc, id)
	}
	if len(samples) > 0 {
		v.cold.add(summarise(samples, sum))
	}
}

// sanitize makes a variant name usable in a file name.
func sanitize(s string) string {
	out := []byte(s)
	for i, c := range out {
		if c == '/' {
			out[i] = '-'
		}
	}
	return string(out)
}
