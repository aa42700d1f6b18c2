// Command bench is boxrt's benchmark harness (make bench → scripts/bench →
// this program). It measures and never asserts: it spawns the built boxrt
// binary the way a host does, drives it over its wire protocols next to a
// baseline that does the same work without boxrt, repeats every case, and
// writes docs/benchmarks.md with both side by side.
//
//	go run ./test/bench -boxrt bin/boxrt -out docs/benchmarks.md
//	go run ./test/bench -boxrt bin/boxrt -quick            # ~1 minute smoke run
//	go run ./test/bench -boxrt bin/boxrt -only ping,relay  # a subset
//	go run ./test/bench -boxrt bin/boxrt -only burst -out /tmp/burst.md
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/test/bench/echopeer"
)

// config holds every knob; -quick changes the defaults of those not set
// explicitly.
type config struct {
	boxrtBin string
	out      string
	jsonOut  string
	quick    bool
	only     string
	backends string
	keepWork bool
	image    string
	reps     int

	pingN        int // sequential __ping calls per run (1 caller)
	pingConcN    int // calls per caller per run (64 callers)
	pingCallers  int
	execNDocker  int // warm execs per run: boxrt docker and the raw API
	execNCLI     int // docker exec CLI per run
	execNBwrap   int // boxrt bwrap and direct bwrap per run
	coldNDocker  int // fresh sessions per run, docker backend
	coldNBwrap   int // fresh sessions per run, bwrap backend
	relayN       int // relay round trips per run
	streamSec    float64
	execStreamMB int // MB a command prints in the exec-stream scenario
	scaleDocker  int
	scaleBwrap   int
	scaleReps    int
	scaleConc    int
	reconnectN   int // respawn/restart cycles per run (passed to the hook)
	reconnectRep int // repetitions of the reconnect scenario
	kubeReps     int // repetitions of the kube scenario (each Pod start is seconds)
	// burst: memory after many concurrent execs
	burstSessions int
	burstExecs    int
	// the large burst case: RSS and completion goals
	burstLargeSessions int
	burstLargeExecs    int
	burstIdle          time.Duration // burst64: its "back under" goal is within this
	burstSettle        time.Duration // the burst scenario's cases: the RSS after it is only reported
	burstReps          int
	timeoutTotal       time.Duration
	waitQuiet          time.Duration
	kubeconfig         string
}

func defaults(quick bool) config {
	if quick {
		return config{reps: 3, pingN: 2000, pingConcN: 40, pingCallers: 64, execNDocker: 15, execNCLI: 6,
			execNBwrap: 30, coldNDocker: 2, coldNBwrap: 5, relayN: 300, streamSec: 0.5, execStreamMB: 20, scaleDocker: 10,
			scaleBwrap: 50, scaleReps: 1, scaleConc: 4, reconnectN: 2, reconnectRep: 1, kubeReps: 1, burstSessions: 20, burstExecs: 60,
			burstLargeSessions: 60, burstLargeExecs: 200, burstIdle: 5 * time.Second, burstSettle: 5 * time.Second, burstReps: 1, timeoutTotal: 10 * time.Minute}
	}
	// Sized for a full run of under 20 minutes on 2 cores: enough calls
	// that a p50 is stable to a few per cent, one pass of the slow scale,
	// reconnect and kube scenarios.
	return config{reps: 3, pingN: 20000, pingConcN: 500, pingCallers: 64, execNDocker: 40, execNCLI: 10,
		execNBwrap: 120, coldNDocker: 8, coldNBwrap: 30, relayN: 3000, streamSec: 3, execStreamMB: 200, scaleDocker: 200,
		scaleBwrap: 1000, scaleReps: 1, scaleConc: 4, reconnectN: 4, reconnectRep: 1, kubeReps: 1, burstSessions: 100, burstExecs: 300,
		burstLargeSessions: 300, burstLargeExecs: 1000, burstIdle: 30 * time.Second, burstSettle: 10 * time.Second, burstReps: 1, timeoutTotal: 45 * time.Minute}
}

func main() {
	var echoMode string
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	fs.StringVar(&echoMode, "echo-peer", "", "internal: run the echo baseline peer (stdio or ws)")
	var c config
	fs.StringVar(&c.boxrtBin, "boxrt", "bin/boxrt", "the boxrt binary to measure")
	fs.StringVar(&c.out, "out", "docs/benchmarks.md", "where to write the report")
	fs.StringVar(&c.jsonOut, "json", filepath.Join(os.TempDir(), "boxrt-bench-runs.json"), "where to write every run's numbers (JSON)")
	fs.BoolVar(&c.quick, "quick", false, "smoke run: small counts, about a minute")
	fs.StringVar(&c.only, "only", "", "comma-separated scenarios to run: ping,exec,session,relay,ports,reconnect,dialout,scale,burst,burst64,idle,durable,stream,files,kube,langbot,isolation,e2b,mcp,egress (default all)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster the kube scenario uses (default $BOXRT_TEST_KUBECONFIG, else scripts/kube-up's)")
	fs.StringVar(&c.backends, "backends", "docker,bwrap", "comma-separated backends the exec and session scenarios measure: docker,bwrap")
	fs.BoolVar(&c.keepWork, "keep-work", false, "keep the work directory (boxrt logs, state dirs)")
	fs.StringVar(&c.image, "image", envOr("BOXRT_TEST_IMAGE", "boxrt-test:busybox"), "docker image for the docker cases")
	d := defaults(false)
	fs.IntVar(&c.reps, "reps", d.reps, "repetitions of each scenario (medians are reported)")
	fs.IntVar(&c.pingN, "ping-n", d.pingN, "__ping calls per run with 1 caller")
	fs.IntVar(&c.pingConcN, "ping-conc-n", d.pingConcN, "__ping calls per caller per run with many callers")
	fs.IntVar(&c.pingCallers, "ping-callers", d.pingCallers, "concurrent __ping callers")
	fs.IntVar(&c.execNDocker, "exec-n-docker", d.execNDocker, "warm execs per run, docker (boxrt and raw Engine API)")
	fs.IntVar(&c.execNCLI, "exec-n-cli", d.execNCLI, "docker exec CLI calls per run")
	fs.IntVar(&c.execNBwrap, "exec-n-bwrap", d.execNBwrap, "warm execs per run, bwrap (boxrt and direct bwrap)")
	fs.IntVar(&c.coldNDocker, "cold-n-docker", d.coldNDocker, "fresh sessions per run, docker")
	fs.IntVar(&c.coldNBwrap, "cold-n-bwrap", d.coldNBwrap, "fresh sessions per run, bwrap")
	fs.IntVar(&c.relayN, "relay-n", d.relayN, "relay round trips per run")
	fs.IntVar(&c.execStreamMB, "stream-mb", d.execStreamMB, "MB the command prints in the stream scenario (streamed box_exec throughput)")
	fs.Float64Var(&c.streamSec, "stream-sec", d.streamSec, "seconds of streaming per run")
	fs.IntVar(&c.scaleDocker, "scale-docker", d.scaleDocker, "docker sessions in the scale scenario")
	fs.IntVar(&c.scaleBwrap, "scale-bwrap", d.scaleBwrap, "bwrap sessions in the scale scenario")
	fs.IntVar(&c.scaleReps, "scale-reps", d.scaleReps, "repetitions of the scale scenario")
	fs.IntVar(&c.scaleConc, "scale-concurrency", d.scaleConc, "concurrent box_create_session callers in the scale scenario")
	fs.IntVar(&c.reconnectN, "reconnect-n", d.reconnectN, "respawn/restart cycles per run (reconnect hook)")
	fs.IntVar(&c.reconnectRep, "reconnect-reps", d.reconnectRep, "repetitions of the reconnect scenario")
	fs.IntVar(&c.kubeReps, "kube-reps", d.kubeReps, "repetitions of the kube scenario")
	fs.IntVar(&c.burstSessions, "burst-sessions", d.burstSessions, "bwrap sessions in the burst scenario's first case")
	fs.IntVar(&c.burstExecs, "burst-execs", d.burstExecs, "execs sent at once in the burst scenario's first case")
	fs.IntVar(&c.burstLargeSessions, "burst-large-sessions", d.burstLargeSessions, "bwrap sessions in the burst scenario's large case")
	fs.IntVar(&c.burstLargeExecs, "burst-large-execs", d.burstLargeExecs, "execs sent at once in the burst scenario's large case")
	fs.DurationVar(&c.burstIdle, "burst-idle", d.burstIdle, "idle wait after the 64-exec burst before the last RSS reading (its goal)")
	fs.DurationVar(&c.burstSettle, "burst-settle", d.burstSettle, "idle wait after each case of the burst scenario before the last RSS reading")
	fs.IntVar(&c.burstReps, "burst-reps", d.burstReps, "repetitions of the burst scenario")
	fs.DurationVar(&c.timeoutTotal, "timeout", d.timeoutTotal, "give up on the remaining scenarios after this long")
	fs.DurationVar(&c.waitQuiet, "wait-quiet", 0, "before starting, wait up to this long for the machine to be idle (CPU busy under 20% over 5 s)")
	_ = fs.Parse(os.Args[1:])

	switch echoMode {
	case "":
	case "stdio":
		if err := echopeer.ServeLines(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "echo peer:", err)
			os.Exit(1)
		}
		return
	case "ws":
		if err := runEchoWS(); err != nil {
			fmt.Fprintln(os.Stderr, "echo peer:", err)
			os.Exit(1)
		}
		return
	default:
		fmt.Fprintln(os.Stderr, "unknown -echo-peer mode", echoMode)
		os.Exit(2)
	}

	if c.quick {
		q := defaults(true)
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		apply := func(name string, dst *int, v int) {
			if !set[name] {
				*dst = v
			}
		}
		apply("reps", &c.reps, q.reps)
		apply("ping-n", &c.pingN, q.pingN)
		apply("ping-conc-n", &c.pingConcN, q.pingConcN)
		apply("exec-n-docker", &c.execNDocker, q.execNDocker)
		apply("exec-n-cli", &c.execNCLI, q.execNCLI)
		apply("exec-n-bwrap", &c.execNBwrap, q.execNBwrap)
		apply("cold-n-docker", &c.coldNDocker, q.coldNDocker)
		apply("cold-n-bwrap", &c.coldNBwrap, q.coldNBwrap)
		apply("relay-n", &c.relayN, q.relayN)
		apply("stream-mb", &c.execStreamMB, q.execStreamMB)
		apply("scale-docker", &c.scaleDocker, q.scaleDocker)
		apply("scale-bwrap", &c.scaleBwrap, q.scaleBwrap)
		apply("scale-reps", &c.scaleReps, q.scaleReps)
		apply("reconnect-n", &c.reconnectN, q.reconnectN)
		apply("reconnect-reps", &c.reconnectRep, q.reconnectRep)
		apply("kube-reps", &c.kubeReps, q.kubeReps)
		apply("burst-sessions", &c.burstSessions, q.burstSessions)
		apply("burst-execs", &c.burstExecs, q.burstExecs)
		apply("burst-large-sessions", &c.burstLargeSessions, q.burstLargeSessions)
		apply("burst-large-execs", &c.burstLargeExecs, q.burstLargeExecs)
		apply("burst-reps", &c.burstReps, q.burstReps)
		if !set["burst-idle"] {
			c.burstIdle = q.burstIdle
		}
		if !set["burst-settle"] {
			c.burstSettle = q.burstSettle
		}
		if !set["stream-sec"] {
			c.streamSec = q.streamSec
		}
		if !set["timeout"] {
			c.timeoutTotal = q.timeoutTotal
		}
	}
	c.reps = max(c.reps, 1)
	c.burstReps = max(c.burstReps, 1)
	c.burstSessions = max(c.burstSessions, 1)
	c.burstLargeSessions = max(c.burstLargeSessions, 1)
	c.reconnectRep = max(c.reconnectRep, 1)
	c.kubeReps = max(c.kubeReps, 1)

	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// bench is one harness run.
type bench struct {
	cfg       config
	boxrtBin  string
	selfBin   string
	workDir   string
	token     string
	start     time.Time
	scenarios []*Scenario
	machine   Machine
	noise     Noise
	cleanup   []string // notes on what the final cleanup found
	// instances are the instance ids of the boxrt processes this run
	// started: the final cleanup removes only their containers.
	instances map[string]bool

	echoMu sync.Mutex
	// echoExe is the echo peers' executable (echoExecutable).
	echoExe string
}

// wantBackend reports whether -backends selects a backend.
func (b *bench) wantBackend(name string) bool {
	for _, s := range strings.Split(b.cfg.backends, ",") {
		if strings.TrimSpace(s) == name {
			return true
		}
	}
	return false
}

// skippedBackend is the Unavailable text of a backend -backends left out.
const skippedBackend = "not selected (-backends)"

func (b *bench) want(name string) bool {
	if b.cfg.only == "" {
		return true
	}
	for _, s := range strings.Split(b.cfg.only, ",") {
		if strings.TrimSpace(s) == name {
			return true
		}
	}
	return false
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench %6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

// runScenario runs one scenario; a panic (the reconnect hook is another
// engineer's code) is reported in that scenario's section instead of
// losing the whole report.
func (b *bench) runScenario(ctx context.Context, fn func(context.Context) *Scenario) (sc *Scenario) {
	defer func() {
		if r := recover(); r != nil {
			b.logf("scenario panicked: %v\n%s", r, debug.Stack())
			sc = &Scenario{Skipped: fmt.Sprintf("**Not measured: the scenario panicked:** `%v` (stack trace in the harness's stderr).", r)}
		}
	}()
	return fn(ctx)
}

func run(c config) error {
	b := &bench{cfg: c, start: time.Now(), instances: map[string]bool{}}
	var err error
	if b.boxrtBin, err = filepath.Abs(c.boxrtBin); err != nil {
		return err
	}
	if _, err := os.Stat(b.boxrtBin); err != nil {
		return fmt.Errorf("boxrt binary: %v (build it first: go build -o bin/boxrt .)", err)
	}
	if b.selfBin, err = os.Executable(); err != nil {
		return err
	}
	if b.workDir, err = os.MkdirTemp("", "boxrt-bench-"); err != nil {
		return err
	}
	// The bare bwrap baselines run as boxrt's unprivileged sandbox user,
	// which must pass through to their directories.
	if err := os.Chmod(b.workDir, 0o711); err != nil {
		return err
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	b.token = hex.EncodeToString(tok)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.timeoutTotal)
	defer cancel()

	b.logf("work dir %s; boxrt %s", b.workDir, b.boxrtBin)
	if c.waitQuiet > 0 {
		b.noise.Waited = b.waitQuiet(ctx, c.waitQuiet)
	}
	b.machine = collectMachine()
	b.noise.LoadBefore = loadAvg()
	b.noise.StatBefore = readCPUStat()
	b.logf("calibrating (before)")
	b.noise.Before = calibrate(15)

	type step struct {
		name string
		fn   func(context.Context) *Scenario
	}
	steps := []step{
		{"ping", b.scenarioPing},
		{"exec", b.scenarioExec},
		{"session", b.scenarioSession},
		{"relay", b.scenarioRelay},
		{"ports", b.scenarioPorts},
		{"reconnect", b.scenarioReconnect},
		{"dialout", b.scenarioDialOut},
		{"scale", b.scenarioScale},
		{"burst", b.scenarioBurst},
		{"burst64", b.scenarioBurst64},
		{"idle", b.scenarioIdle},
		{"durable", b.scenarioDurable},
		{"stream", b.scenarioStream},
		{"files", b.scenarioFiles},
		{"kube", b.scenarioKube},
		{"langbot", b.scenarioLangBot},
		{"isolation", b.scenarioIsolation},
		{"e2b", b.scenarioE2B},
		{"mcp", b.scenarioMCP},
		{"egress", b.scenarioEgress},
	}
	for _, s := range steps {
		if !b.want(s.name) {
			continue
		}
		if ctx.Err() != nil {
			b.scenarios = append(b.scenarios, &Scenario{Key: s.name, Title: s.name, Skipped: "not run: " + ctx.Err().Error()})
			continue
		}
		t0 := time.Now()
		load := loadAvg()
		b.logf("scenario %s (load average %s)", s.name, load)
		sc := b.runScenario(ctx, s.fn)
		sc.Key = s.name
		sc.LoadStart = load
		sc.Elapsed = time.Since(t0)
		b.scenarios = append(b.scenarios, sc)
		b.logf("scenario %s done in %.1fs", s.name, sc.Elapsed.Seconds())
	}

	b.logf("calibrating (after)")
	b.noise.After = calibrate(15)
	b.noise.LoadAfter = loadAvg()
	b.noise.StatAfter = readCPUStat()

	b.finalCleanup()
	total := time.Since(b.start)
	if err := b.writeReport(total); err != nil {
		return err
	}
	b.logf("wrote %s (total %.1fs)", c.out, total.Seconds())
	if c.keepWork {
		b.logf("kept work dir %s", b.workDir)
	} else {
		os.RemoveAll(b.workDir)
	}
	return nil
}
