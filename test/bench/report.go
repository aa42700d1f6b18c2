package main

import (
	_ "embed"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/boxrt/boxrt/internal/clip"
)

// Measure is one implementation measured in one case, over repetitions.
type Measure struct {
	Label       string
	Runs        []RunStats
	Errors      int    // failed operations over all runs
	FirstErr    string // the first failure, verbatim
	Unavailable string // why it was not measured at all
	// Ref marks a copy of a measure that belongs to another scenario: it
	// is shown for comparison but listed (runs, failures) only there.
	Ref bool
}

func newMeasure(label string) *Measure { return &Measure{Label: label} }

func (m *Measure) add(rs RunStats) { m.Runs = append(m.Runs, rs) }

func (m *Measure) fail(err error) {
	m.Errors++
	if m.FirstErr == "" && err != nil {
		m.FirstErr = firstLine(err.Error())
	}
}

func (m *Measure) ok() bool { return m != nil && m.Unavailable == "" && len(m.Runs) > 0 }

// P50 is the median over runs of each run's p50; P99 likewise.
func (m *Measure) P50() time.Duration {
	return medianDur(m.pick(func(r RunStats) time.Duration { return r.P50 }))
}
func (m *Measure) P99() time.Duration {
	return medianDur(m.pick(func(r RunStats) time.Duration { return r.P99 }))
}

// OpsPerSec is the median of the runs' throughputs.
func (m *Measure) OpsPerSec() float64 {
	v := make([]float64, 0, len(m.Runs))
	for _, r := range m.Runs {
		v = append(v, r.Throughput)
	}
	return median(v)
}

func (m *Measure) pick(f func(RunStats) time.Duration) []time.Duration {
	out := make([]time.Duration, 0, len(m.Runs))
	for _, r := range m.Runs {
		out = append(out, f(r))
	}
	return out
}

func (m *Measure) samples() int {
	n := 0
	for _, r := range m.Runs {
		n += r.N
	}
	return n
}

// Row puts boxrt and a baseline side by side.
type Row struct {
	Case  string
	Boxrt *Measure
	Base  *Measure
}

// whereTimeGoes is the hand-measured breakdown of a __ping's cost,
// reproduced in every report that has the ping scenario.
//
//go:embed where_time_goes.md
var whereTimeGoes string

// Hand-measured breakdowns of other cases, each printed at the end of its
// scenario's section so a regenerated report keeps them.
var (
	//go:embed where_time_goes_relay.md
	whereTimeGoesRelay string
	//go:embed where_time_goes_docker_exec.md
	whereTimeGoesDockerExec string
	//go:embed where_time_goes_burst64.md
	whereTimeGoesBurst64 string
	//go:embed where_time_goes_pool.md
	whereTimeGoesPool string
	//go:embed where_time_goes_stream.md
	whereTimeGoesStream string
	//go:embed where_time_goes_scale.md
	whereTimeGoesScale string
)

// Goal is a target stated in the report, with whether it was met.
type Goal struct {
	Text     string
	Measured string
	Met      *bool // nil: could not be measured
	// AtFloor: not met, but no worse than a measured floor that bounds
	// any implementation on this machine; Measured names the floor.
	AtFloor bool
}

func boolp(b bool) *bool { return &b }

// verdict words the goal's outcome: yes or no, at its floor, or "not
// measured".
func (g Goal) verdict(yes, no string) string {
	switch {
	case g.Met == nil:
		return "not measured"
	case *g.Met:
		return yes
	case g.AtFloor:
		return "at its measured floor"
	default:
		return no
	}
}

// Scenario is one section of the report.
type Scenario struct {
	Key     string
	Title   string
	Intro   string
	Rows    []Row
	Goals   []Goal
	Tables  []string // extra markdown tables (already rendered)
	Notes   []string
	Skipped string
	// Breakdown is a hand-measured "where the time goes" section printed
	// after the scenario's own (markdown, from an embedded file).
	Breakdown string
	Elapsed   time.Duration
	LoadStart string // load average when the scenario started
	// extra measures shown only in the raw appendix
	Extra []*Measure
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func fmtOps(v float64) string {
	switch {
	case math.IsNaN(v) || v <= 0:
		return "—"
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func fmtRatio(a, b float64) string {
	if a <= 0 || b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "—"
	}
	r := a / b
	switch {
	case r < 0.01:
		return fmt.Sprintf("%.4f×", r)
	case r < 0.1:
		return fmt.Sprintf("%.3f×", r)
	case r >= 100:
		return fmt.Sprintf("%.0f×", r)
	}
	return fmt.Sprintf("%.2f×", r)
}

func ratio(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return math.NaN()
	}
	return a / b
}

func cell(m *Measure, f func(*Measure) string) string {
	if m == nil {
		return "—"
	}
	if !m.ok() {
		return "n/a"
	}
	return f(m)
}

func renderRows(rows []Row) string {
	var sb strings.Builder
	sb.WriteString("| case | boxrt p50 | boxrt p99 | boxrt ops/s | baseline | baseline p50 | baseline p99 | baseline ops/s | p50 ratio | p99 ratio | ops/s ratio |\n")
	sb.WriteString("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		bl := "—"
		if r.Base != nil {
			bl = r.Base.Label
		}
		p50r, p99r, opsr := "—", "—", "—"
		if r.Boxrt.ok() && r.Base.ok() {
			p50r = fmtRatio(float64(r.Boxrt.P50()), float64(r.Base.P50()))
			p99r = fmtRatio(float64(r.Boxrt.P99()), float64(r.Base.P99()))
			opsr = fmtRatio(r.Boxrt.OpsPerSec(), r.Base.OpsPerSec())
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Case,
			cell(r.Boxrt, func(m *Measure) string { return fmtDur(m.P50()) }),
			cell(r.Boxrt, func(m *Measure) string { return fmtDur(m.P99()) }),
			cell(r.Boxrt, func(m *Measure) string { return fmtOps(m.OpsPerSec()) }),
			bl,
			cell(r.Base, func(m *Measure) string { return fmtDur(m.P50()) }),
			cell(r.Base, func(m *Measure) string { return fmtDur(m.P99()) }),
			cell(r.Base, func(m *Measure) string { return fmtOps(m.OpsPerSec()) }),
			p50r, p99r, opsr)
	}
	return sb.String()
}

// problems lists measures that failed or were not available.
func problems(rows []Row, extra []*Measure) []string {
	seen := map[*Measure]bool{}
	var out []string
	check := func(m *Measure) {
		if m == nil || seen[m] || m.Ref {
			return
		}
		seen[m] = true
		if m.Unavailable != "" {
			out = append(out, fmt.Sprintf("**%s** not measured: %s", m.Label, m.Unavailable))
		} else if m.Errors > 0 {
			out = append(out, fmt.Sprintf("**%s**: %d of %d operations failed (excluded from the statistics); first error: `%s`",
				m.Label, m.Errors, m.Errors+m.samples(), clip.Middle(m.FirstErr, 400)))
		}
	}
	for _, r := range rows {
		check(r.Boxrt)
		check(r.Base)
	}
	for _, m := range extra {
		check(m)
	}
	return out
}

// truncate is clip.String under the name the harness's call sites use.
var truncate = clip.String

func (b *bench) writeReport(total time.Duration) error {
	var sb strings.Builder
	m := b.machine
	mode := "full"
	if b.cfg.quick {
		mode = "quick (smoke run: small counts, numbers are indicative only)"
	}
	sb.WriteString("# boxrt benchmarks\n\n")
	fmt.Fprintf(&sb, "Generated by `make bench` (`scripts/bench` → `test/bench`) on %s. Mode: %s. Total harness time: %s.\n\n",
		m.Date.Format("2006-01-02 15:04 MST"), mode, total.Round(time.Second))
	sb.WriteString("These numbers are measurements, not assertions: nothing here fails a build. ")
	fmt.Fprintf(&sb, "Every case ran %d times (the scale scenario %d times, the reconnect scenario %d times, the burst scenario %d times), alternating boxrt and its baseline so drift hits both; ", b.cfg.reps, b.cfg.scaleReps, b.cfg.reconnectRep, b.cfg.burstReps)
	sb.WriteString("**p50 and p99 are the medians over those runs of each run's own p50 and p99**, and ops/s is the median of the runs' throughputs ")
	sb.WriteString("(operations divided by the run's wall time; with one caller that is 1/mean latency). ")
	sb.WriteString("Ratios are boxrt ÷ baseline: for latency above 1 means boxrt is slower, for ops/s below 1 means boxrt is slower. ")
	sb.WriteString("boxrt is the binary `go build` makes, spawned exactly as a host spawns it; the client code is the same for boxrt and the baselines, so its cost is on both sides of every ratio. ")
	sb.WriteString("Per-run numbers are in the appendix.\n\n")

	sb.WriteString("## Machine\n\n| | |\n|---|---|\n")
	fmt.Fprintf(&sb, "| CPU | %s |\n| cores | %d |\n| memory | %s |\n| kernel | %s |\n| OS | %s |\n| cgroups | %s |\n| Docker | %s |\n| bubblewrap | %s |\n| Go | %s |\n| boxrt commit | %s |\n| date | %s |\n\n",
		orNA(m.CPU), m.Cores, orNA(m.MemTotal), orNA(m.Kernel), orNA(m.OS), orNA(m.Cgroup), orNA(m.Docker), orNA(m.Bwrap), m.GoVersion, orNA(m.Commit), m.Date.Format(time.RFC3339))

	n := b.noise
	sb.WriteString("## How noisy the machine was\n\n")
	sb.WriteString("A fixed CPU-bound loop (SHA-256 over a 64 KiB buffer, 2000 times) ran 15 times before and 15 times after the scenarios. ")
	sb.WriteString("Its coefficient of variation (stddev ÷ mean) shows how steady one core was; a shift of its mean between before and after shows drift (frequency scaling, a neighbour). ")
	sb.WriteString("Steal is the share of CPU time the hypervisor gave to others during the run (from /proc/stat); busy is how loaded both cores were on average over the whole run.\n\n")
	sb.WriteString("| | before | after |\n|---|---:|---:|\n")
	fmt.Fprintf(&sb, "| calibration mean | %s | %s |\n", fmtDur(n.Before.Mean), fmtDur(n.After.Mean))
	fmt.Fprintf(&sb, "| calibration CV | %.2f%% | %.2f%% |\n", 100*n.Before.CV, 100*n.After.CV)
	fmt.Fprintf(&sb, "| load average (1/5/15 min) | %s | %s |\n\n", n.LoadBefore, n.LoadAfter)
	if n.Waited != "" {
		fmt.Fprintf(&sb, "Before starting, the harness %s.\n\n", n.Waited)
	}
	drift := 100 * (float64(n.After.Mean) - float64(n.Before.Mean)) / float64(n.Before.Mean)
	fmt.Fprintf(&sb, "Drift of the calibration mean: %+.1f%%. CPU steal over the run: %.2f%%. Average CPU busy over the run: %.0f%% of %d cores. ",
		drift, stealPct(n.StatBefore, n.StatAfter), busyPct(n.StatBefore, n.StatAfter), m.Cores)
	worst := max(n.Before.CV, n.After.CV)
	peak, peakAt := 0.0, ""
	for _, s := range b.scenarios {
		if f := strings.Fields(s.LoadStart); len(f) > 0 {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil && v > peak {
				peak, peakAt = v, s.Key
			}
		}
	}
	fmt.Fprintf(&sb, "The 1-minute load average at the start of each scenario is under its section; the highest was %.2f (before %q). ", peak, peakAt)
	if peak > float64(m.Cores)+1 {
		sb.WriteString("That is well above what the harness alone keeps runnable (its previous scenario's 1–2 processes decaying out of the average), " +
			"so other work on this machine overlapped parts of the run: the calibration was steady or not only at the start and end, and individual " +
			"scenarios may carry more noise than the verdict below says — the per-run spread in the appendix shows where. ")
	}
	switch {
	case worst < 0.02 && math.Abs(drift) < 5:
		sb.WriteString("Verdict: **quiet** — differences of a few percent between rows are still within noise, larger ones are real.\n\n")
	case worst < 0.05 && math.Abs(drift) < 10:
		sb.WriteString("Verdict: **somewhat noisy** — treat differences under ~10% as noise.\n\n")
	default:
		sb.WriteString("Verdict: **noisy** — only large differences (well over 10%) mean anything in this run; rerun on a quiet machine before drawing conclusions.\n\n")
	}

	// goals summary
	var goals []Goal
	for _, s := range b.scenarios {
		goals = append(goals, s.Goals...)
	}
	if len(goals) > 0 {
		sb.WriteString("## Goals\n\n| goal | measured | met? |\n|---|---|---|\n")
		for _, g := range goals {
			fmt.Fprintf(&sb, "| %s | %s | %s |\n", g.Text, g.Measured, g.verdict("**yes**", "**no**"))
		}
		sb.WriteString("\n")
	}

	for i, s := range b.scenarios {
		title := s.Title
		if title == "" {
			title = s.Key
		}
		fmt.Fprintf(&sb, "## %d. %s\n\n", i+1, title)
		if s.Skipped != "" {
			fmt.Fprintf(&sb, "%s\n\n", s.Skipped)
			continue
		}
		if s.Intro != "" {
			sb.WriteString(strings.TrimSpace(s.Intro) + "\n\n")
		}
		if len(s.Rows) > 0 {
			sb.WriteString(renderRows(s.Rows) + "\n")
		}
		for _, t := range s.Tables {
			sb.WriteString(strings.TrimSpace(t) + "\n\n")
		}
		for _, g := range s.Goals {
			fmt.Fprintf(&sb, "- Goal: %s — %s: %s.\n", g.Text, g.verdict("met", "**not met**"), g.Measured)
		}
		notes := append(problems(s.Rows, s.Extra), s.Notes...)
		for _, note := range notes {
			fmt.Fprintf(&sb, "- %s\n", note)
		}
		fmt.Fprintf(&sb, "\n_Scenario time: %s; load average when it started: %s._\n\n", s.Elapsed.Round(100*time.Millisecond), s.LoadStart)
		if s.Breakdown != "" {
			sb.WriteString(strings.TrimSpace(s.Breakdown) + "\n\n")
		}
	}

	if b.want("ping") {
		sb.WriteString(strings.TrimSpace(whereTimeGoes) + "\n\n")
	}

	if len(b.cleanup) > 0 {
		sb.WriteString("## Cleanup\n\n")
		for _, c := range b.cleanup {
			fmt.Fprintf(&sb, "- %s\n", c)
		}
		sb.WriteString("\n")
	}

	sb.WriteString("## Appendix: per-run numbers\n\n")
	sb.WriteString("| scenario | measured | run | samples | p50 | p99 | ops/s |\n|---|---|---:|---:|---:|---:|---:|\n")
	seen := map[*Measure]bool{} // a measure shared by two scenarios is listed once
	for _, s := range b.scenarios {
		var ms []*Measure
		for _, r := range s.Rows {
			for _, x := range []*Measure{r.Boxrt, r.Base} {
				if x != nil && !x.Ref && !seen[x] {
					seen[x] = true
					ms = append(ms, x)
				}
			}
		}
		for _, x := range s.Extra {
			if !seen[x] {
				seen[x] = true
				ms = append(ms, x)
			}
		}
		for _, x := range ms {
			for i, r := range x.Runs {
				fmt.Fprintf(&sb, "| %s | %s | %d | %d | %s | %s | %s |\n", s.Key, x.Label, i+1, r.N, fmtDur(r.P50), fmtDur(r.P99), fmtOps(r.Throughput))
			}
		}
	}
	sb.WriteString("\n")
	sb.WriteString("## How to run\n\n```\nmake bench                      # full run (installs what it needs, builds boxrt, writes this file)\nscripts/bench -quick            # ~1 minute smoke run\nscripts/bench -only ping,relay  # a subset; any flag of test/bench works, see: go run ./test/bench -h\n```\n")

	out := b.cfg.out
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, []byte(sb.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

func orNA(s string) string {
	if s == "" {
		return "unavailable"
	}
	return s
}
