package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/boxrt/boxrt/backends/bwrap"
)

// The baselines do what boxrt does per call with nothing of boxrt around
// it: the Docker Engine API from Go (the floor a docker backend can reach),
// the docker CLI (what the reference Python runtime does per call) and a
// bare bwrap spawn.

// benchLabel marks the containers the harness itself starts (not boxrt's),
// so the final cleanup finds them.
const benchLabel = "boxrt.bench"

// dockerFloor execs into a container through the Engine API.
type dockerFloor struct {
	cli *client.Client
	id  string
}

func newDockerClient() (*client.Client, error) {
	return client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
}

// exec runs argv in the container the way an API client must: create the
// exec, attach (which starts it: POST /exec/{id}/start, hijacked), read
// both streams to EOF, inspect for the exit code.
func (f *dockerFloor) exec(ctx context.Context, argv []string) (string, error) {
	return f.run(ctx, container.ExecOptions{AttachStdout: true, AttachStderr: true, Cmd: argv})
}

// execWrapped is exec of argv set up as boxrt's docker backend sets up a
// command's wrapper (docker.ExecCommand): stdin attached, which its kill
// watcher reads until the connection closes, and / as the working
// directory, which the wrapper leaves for the command's own.
func (f *dockerFloor) execWrapped(ctx context.Context, argv []string) (string, error) {
	return f.run(ctx, container.ExecOptions{AttachStdin: true, AttachStdout: true, AttachStderr: true, WorkingDir: "/", Cmd: argv})
}

func (f *dockerFloor) run(ctx context.Context, opts container.ExecOptions) (string, error) {
	created, err := f.cli.ContainerExecCreate(ctx, f.id, opts)
	if err != nil {
		return "", err
	}
	hj, err := f.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return "", err
	}
	var out, errOut bytes.Buffer
	_, err = stdcopy.StdCopy(&out, &errOut, hj.Reader)
	hj.Close()
	if err != nil {
		return "", err
	}
	ins, err := f.cli.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return "", err
	}
	if ins.ExitCode != 0 {
		return "", fmt.Errorf("exit code %d: %s", ins.ExitCode, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// runCmd runs a command, returning stdout; a non-zero exit is an error
// carrying stderr.
func runCmd(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// runBwrap runs argv in a bare bubblewrap sandbox made exactly as a boxrt
// bwrap exec's (bwrap.BareCommand: the same options, seccomp filter,
// argument memfd and unprivileged sandbox user) on dir's workspace, tmp
// and home, without boxrt around it: no session, stage, cgroup or
// bookkeeping. The floor for "a bwrap process per exec".
func runBwrap(ctx context.Context, dir string, argv ...string) (string, error) {
	cmd, release, err := bwrap.BareCommand(ctx, dir, argv...)
	if err != nil {
		return "", err
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Start()
	release()
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return out.String(), fmt.Errorf("bwrap: %v: %s", err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// timedOp is one case of an interleaved run; with every k > 1 it runs
// only every k-th round.
type timedOp struct {
	m     *Measure
	every int
	op    func() error
	// before runs right before each op, untimed (idle time, the call
	// that leaves work in flight for the timed one); after right after
	// it (a session's delete, the wait for a pool's refill); done once
	// after the last round.
	before, after func()
	done          func()
}

// timeInterleaved runs n rounds of every case, one call each in turn, in
// an order shuffled every round: drift in the machine's speed hits every
// case alike, and no case always runs right after the same other one. A
// case can leave work behind that slows whichever runs next (a docker
// exec's kill watcher cleans up once the exec's connection closes): with
// the order only rotating, each case kept its predecessor, and the raw
// exec that always followed boxrt's measured slower than the same exec in
// a login shell.
func timeInterleaved(ctx context.Context, n int, ops ...timedOp) {
	timeInBlocks(ctx, n, 1, ops...)
}

// timeInBlocks is timeInterleaved with each case's turn a block of calls
// in a row: a case that should be measured warm (its threads awake from
// the call before, not parked since the other cases' turns) still shares
// the machine's drift with the others at the scale of a block.
func timeInBlocks(ctx context.Context, n, block int, ops ...timedOp) {
	samples := make([][]time.Duration, len(ops))
	// A fixed seed: the same sequence of orders in every run.
	rng := rand.New(rand.NewPCG(1, 2))
	order := make([]int, len(ops))
	for i := 0; i < n && ctx.Err() == nil; i += block {
		for k := range order {
			order[k] = k
		}
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, j := range order {
			o := ops[j]
			for c := i; c < min(i+block, n); c++ {
				if o.every > 1 && c%o.every != 0 {
					continue
				}
				if o.before != nil {
					o.before()
				}
				s := time.Now()
				err := o.op()
				d := time.Since(s)
				if o.after != nil {
					o.after()
				}
				if err != nil {
					o.m.fail(err)
					continue
				}
				samples[j] = append(samples[j], d)
			}
		}
	}
	for j, o := range ops {
		addSamples(o.m, samples[j])
		if o.done != nil {
			o.done()
		}
	}
}

// timeOps runs op n times sequentially and summarises the successful ones.
func timeOps(ctx context.Context, m *Measure, n int, op func(i int) error) {
	samples := make([]time.Duration, 0, n)
	t0 := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		s := time.Now()
		err := op(i)
		d := time.Since(s)
		if err != nil {
			m.fail(err)
			continue
		}
		samples = append(samples, d)
	}
	if len(samples) > 0 {
		m.add(summarise(samples, time.Since(t0)))
	}
}

var errUnexpectedOutput = errors.New("unexpected output")

func expectOut(got, want string) error {
	if got != want {
		return fmt.Errorf("%w: %q, want %q", errUnexpectedOutput, truncate(got, 100), want)
	}
	return nil
}
