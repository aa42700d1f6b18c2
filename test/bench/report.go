package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/boxrt/boxrt/internal/atomicfile"
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

// Hand-measured "where the time goes" notes, kept beside the harness
// (test/bench/*.md): a scenario's report section links to its note.
const (
	whereTimeGoesRelay      = "where_time_goes_relay.md"
	whereTimeGoesDockerExec = "where_time_goes_docker_exec.md"
	whereTimeGoesBurst64    = "where_time_goes_burst64.md"
	whereTimeGoesPool       = "where_time_goes_pool.md"
	whereTimeGoesStream     = "where_time_goes_stream.md"
	whereTimeGoesScale      = "where_time_goes_scale.md"
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
	// Breakdown names the scenario's hand-measured "where the time
	// goes" note in test/bench, linked from its section.
	Breakdown string
	Elapsed   time.Duration
	LoadStart string // load average when the scenario started
	// extra measures: in the -json file and the problems list only
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

// writeReport writes the one-page summary to -out and every run's
// numbers to -json.
func (b *bench) writeReport(total time.Duration) error {
	var sb strings.Builder
	m := b.machine
	mode := "full"
	if b.cfg.quick {
		mode = "quick (smoke run: small counts, numbers are indicative only)"
	} else if b.cfg.only != "" {
		mode = "subset (-only " + b.cfg.only + ")"
	}
	sb.WriteString("# boxrt benchmarks\n\n")
	fmt.Fprintf(&sb, "`make bench` on %s, boxrt %s. Mode: %s. Harness time: %s. ",
		m.Date.Format("2006-01-02 15:04 MST"), orNA(m.Commit), mode, total.Round(time.Second))
	fmt.Fprintf(&sb, "Measurements, not assertions. Each case ran %d times, boxrt and its baseline taking turns; "+
		"p50/p99 are the medians of the runs' own p50/p99, ops/s the median of the runs' throughputs; ratios are boxrt ÷ baseline. "+
		"Per-run numbers: the JSON file the run writes (`-json`, not committed).\n\n", b.cfg.reps)
	fmt.Fprintf(&sb, "**Machine:** %s, %d cores, %s; kernel %s; %s; cgroups %s; Docker %s; %s; %s.\n\n",
		orNA(m.CPU), m.Cores, orNA(m.MemTotal), orNA(m.Kernel), orNA(m.OS), orNA(m.Cgroup), orNA(m.Docker), orNA(m.Bwrap), m.GoVersion)
	sb.WriteString(b.noiseVerdict() + "\n\n")
	method := methodPath(b.cfg.out)
	fmt.Fprintf(&sb, "How each scenario measures, its baselines and notes: [%s](%s).\n\n", filepath.Base(method), filepath.Base(method))
	sb.WriteString(b.goalsTable())
	var mb strings.Builder
	fmt.Fprintf(&mb, "# boxrt benchmarks: method and notes\n\nThe scenarios of the run summarised in [%s](%s) (boxrt %s): what each one does, its baselines, and what its numbers mean.\n\n",
		filepath.Base(b.cfg.out), filepath.Base(b.cfg.out), orNA(m.Commit))
	for i, s := range b.scenarios {
		writeScenario(&sb, i+1, s)
		writeMethod(&mb, i+1, s)
	}
	if len(b.cleanup) > 0 {
		sb.WriteString("**Cleanup:** " + strings.Join(b.cleanup, "; ") + "\n\n")
	}
	sb.WriteString("Run it: `make bench` (full), `scripts/bench -quick` (a minute), `scripts/bench -only ping,e2b` (a subset; `go run ./test/bench -h` lists the flags).\n")
	if err := writeReportFile(b.cfg.out, []byte(sb.String())); err != nil {
		return err
	}
	if err := writeReportFile(method, []byte(mb.String())); err != nil {
		return err
	}
	return b.writeRuns()
}

// methodPath is where the method file goes beside the report:
// docs/benchmarks.md → docs/benchmarks-method.md.
func methodPath(report string) string {
	return strings.TrimSuffix(report, filepath.Ext(report)) + "-method.md"
}

// noiseVerdict is the paragraph on how steady the machine was: a fixed
// CPU-bound loop timed before and after the scenarios, steal and load.
func (b *bench) noiseVerdict() string {
	n, m := b.noise, b.machine
	drift := 100 * (float64(n.After.Mean) - float64(n.Before.Mean)) / float64(n.Before.Mean)
	worst := max(n.Before.CV, n.After.CV)
	peak, peakAt := 0.0, ""
	for _, s := range b.scenarios {
		if f := strings.Fields(s.LoadStart); len(f) > 0 {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil && v > peak {
				peak, peakAt = v, s.Key
			}
		}
	}
	out := fmt.Sprintf("**Noise:** a fixed SHA-256 loop took %s (CV %.1f%%) before and %s (CV %.1f%%) after the scenarios (drift %+.1f%%); "+
		"CPU steal %.2f%%, busy %.0f%% of %d cores; highest 1-minute load at a scenario's start %.2f (%s). ",
		fmtDur(n.Before.Mean), 100*n.Before.CV, fmtDur(n.After.Mean), 100*n.After.CV, drift,
		stealPct(n.StatBefore, n.StatAfter), busyPct(n.StatBefore, n.StatAfter), m.Cores, peak, peakAt)
	if n.Waited != "" {
		out += "Before starting, the harness " + n.Waited + ". "
	}
	if peak > float64(m.Cores)+1 {
		out += "Other work overlapped parts of the run. "
	}
	switch {
	case worst < 0.02 && math.Abs(drift) < 5:
		return out + "Verdict: **quiet** — differences of a few per cent are noise, larger ones real."
	case worst < 0.05 && math.Abs(drift) < 10:
		return out + "Verdict: **somewhat noisy** — treat differences under ~10% as noise."
	}
	return out + "Verdict: **noisy** — only differences well over 10% mean anything; rerun on a quiet machine."
}

// goalsTable lists every scenario's goals with their verdicts.
func (b *bench) goalsTable() string {
	var sb strings.Builder
	sb.WriteString("## Goals\n\n| goal | measured | met? |\n|---|---|---|\n")
	for _, s := range b.scenarios {
		for _, g := range s.Goals {
			fmt.Fprintf(&sb, "| %s | %s | %s |\n", g.Text, g.Measured, g.verdict("**yes**", "**no**"))
		}
	}
	return sb.String() + "\n"
}

// writeScenario is one scenario's section of the summary: its tables and
// the problems its measures met (how it measures is in the method file).
func writeScenario(sb *strings.Builder, n int, s *Scenario) {
	fmt.Fprintf(sb, "## %d. %s (%s, load %s at its start)\n\n", n, scenarioTitle(s), s.Elapsed.Round(100*time.Millisecond), s.LoadStart)
	if s.Skipped != "" {
		fmt.Fprintf(sb, "%s\n\n", s.Skipped)
		return
	}
	if len(s.Rows) > 0 {
		sb.WriteString(renderRows(s.Rows) + "\n")
	}
	for _, t := range s.Tables {
		sb.WriteString(strings.TrimSpace(t) + "\n\n")
	}
	if ps := problems(s.Rows, s.Extra); len(ps) > 0 {
		sb.WriteString("- " + strings.Join(ps, "\n- ") + "\n\n")
	}
}

// writeMethod is one scenario's section of the method file: what it
// does, its notes, and where a hand measurement of it lies.
func writeMethod(sb *strings.Builder, n int, s *Scenario) {
	fmt.Fprintf(sb, "## %d. %s\n\n", n, scenarioTitle(s))
	if s.Intro != "" {
		// One paragraph per scenario, however its source wraps it.
		sb.WriteString(strings.Join(strings.Fields(s.Intro), " ") + "\n\n")
	}
	for _, note := range s.Notes {
		fmt.Fprintf(sb, "- %s\n", note)
	}
	if s.Breakdown != "" {
		fmt.Fprintf(sb, "\nWhere the time goes, measured by hand: [test/bench/%s](../test/bench/%s).\n", s.Breakdown, s.Breakdown)
	}
	sb.WriteString("\n")
}

func scenarioTitle(s *Scenario) string {
	if s.Title == "" {
		return s.Key
	}
	return s.Title
}

// runRecord is one run of one measure in the -json file.
type runRecord struct {
	Scenario string        `json:"scenario"`
	Measure  string        `json:"measure"`
	Run      int           `json:"run"`
	Samples  int           `json:"samples"`
	P50      time.Duration `json:"p50_ns"`
	P99      time.Duration `json:"p99_ns"`
	OpsPerS  float64       `json:"ops_per_s"`
	Errors   int           `json:"errors,omitempty"`
	FirstErr string        `json:"first_error,omitempty"`
	NotRun   string        `json:"unavailable,omitempty"`
}

// writeRuns writes every measure's runs (a measure two scenarios share
// once) to -json.
func (b *bench) writeRuns() error {
	var recs []runRecord
	seen := map[*Measure]bool{}
	for _, s := range b.scenarios {
		var ms []*Measure
		for _, r := range s.Rows {
			ms = append(ms, r.Boxrt, r.Base)
		}
		for _, x := range append(ms, s.Extra...) {
			if x == nil || x.Ref || seen[x] {
				continue
			}
			seen[x] = true
			if len(x.Runs) == 0 {
				recs = append(recs, runRecord{Scenario: s.Key, Measure: x.Label, Errors: x.Errors, FirstErr: x.FirstErr, NotRun: x.Unavailable})
			}
			for i, r := range x.Runs {
				recs = append(recs, runRecord{Scenario: s.Key, Measure: x.Label, Run: i + 1, Samples: r.N, P50: r.P50, P99: r.P99,
					OpsPerS: r.Throughput, Errors: x.Errors, FirstErr: x.FirstErr})
			}
		}
	}
	out, err := json.MarshalIndent(map[string]any{"machine": b.machine, "noise": b.noise, "runs": recs}, "", "  ")
	if err != nil {
		return err
	}
	return writeReportFile(b.cfg.jsonOut, append(out, '\n'))
}

// writeReportFile writes a report file whole (through a temporary name),
// making its directory.
func writeReportFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o644)
}

func orNA(s string) string {
	if s == "" {
		return "unavailable"
	}
	return s
}
