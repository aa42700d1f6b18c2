package main

import (
	"context"
	"fmt"
	"time"
)

// flatSamples is how many new sessions (and how many execs on the warm-up
// session) each side of the flatness comparison times.
const flatSamples = 20

// flatStats are one backend's "flat in sessions" numbers, all in one boxrt:
// the same calls with one session alive and with N alive.
type flatStats struct {
	exec1 *Measure // box_exec true on the warm-up session, the only one
	execN *Measure // box_exec true on one of N sessions, again and again
	new1  *Measure // new session → first output, no other session
	newN  *Measure // new session → first output with N alive
}

func newFlatStats(backend string, n int) flatStats {
	return flatStats{
		exec1: newMeasure(fmt.Sprintf("boxrt %s: exec `true`, 1 session", backend)),
		execN: newMeasure(fmt.Sprintf("boxrt %s: exec `true` on one session, %d alive", backend, n)),
		new1:  newMeasure(fmt.Sprintf("boxrt %s: new session → first output, no other session", backend)),
		newN:  newMeasure(fmt.Sprintf("boxrt %s: new session → first output with %d sessions", backend, n)),
	}
}

// timeNewSessions times box_exec `echo hi` on fresh session ids (each
// deleted afterwards, untimed).
func timeNewSessions(ctx context.Context, p *boxrtProc, m *Measure, prefix string) {
	var samples []time.Duration
	for i := 0; i < flatSamples && ctx.Err() == nil; i++ {
		id := fmt.Sprintf("%s%02d", prefix, i)
		st := time.Now()
		_, err := boxExec(ctx, p.rpc, id, "echo hi")
		d := time.Since(st)
		if err != nil {
			m.fail(err)
		} else {
			samples = append(samples, d)
		}
		if err := deleteSession(ctx, p.rpc, id); err != nil {
			m.fail(fmt.Errorf("delete %s: %w", id, err))
		}
	}
	if len(samples) > 0 {
		m.add(summariseSeq(samples))
	}
}

// timeExecs times box_exec `true` on one session, call after call.
func timeExecs(ctx context.Context, p *boxrtProc, m *Measure, id string) {
	timeOps(ctx, m, flatSamples*5, func(int) error {
		_, err := boxExec(ctx, p.rpc, id, "true")
		return err
	})
}

// before times the one-session side on the warm-up session warm.
func (f flatStats) before(ctx context.Context, p *boxrtProc, warm, prefix string) {
	timeExecs(ctx, p, f.exec1, warm)
	timeNewSessions(ctx, p, f.new1, prefix+"new1-")
}

// after times the N-session side, the execs on one of them (one):
// what a session's next command costs with N alive.
func (f flatStats) after(ctx context.Context, p *boxrtProc, one, prefix string) {
	timeExecs(ctx, p, f.execN, one)
	timeNewSessions(ctx, p, f.newN, prefix+"newN-")
}

// flatRows compare each side within the same boxrt.
func flatRows(s *scaleStats) []Row {
	return []Row{
		{Case: fmt.Sprintf("%s: exec `true` with %d sessions vs 1 session", s.backend, s.n), Boxrt: s.flat.execN, Base: s.flat.exec1},
		{Case: fmt.Sprintf("%s: first exec in each of %d sessions vs again in 1 session", s.backend, s.n), Boxrt: s.exec, Base: s.flat.exec1},
		{Case: fmt.Sprintf("%s: new session → first output with %d sessions vs none", s.backend, s.n), Boxrt: s.flat.newN, Base: s.flat.new1},
	}
}

// flatGoals are issue 40's "flat in sessions": an exec and a new session
// cost the same with N sessions alive as with one (p50 within 1.3×).
func flatGoals(s *scaleStats) []Goal {
	return []Goal{
		ratioGoal(fmt.Sprintf("%d sessions: %s exec `true` p50 ≤ 1.3× with one session", s.n, s.backend), s.flat.execN, s.flat.exec1, 1.3),
		ratioGoal(fmt.Sprintf("%d sessions: %s new session → first output p50 ≤ 1.3× with none", s.n, s.backend), s.flat.newN, s.flat.new1, 1.3),
	}
}
