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
	// On docker, the engine alone (no boxrt) at the same two moments: a
	// container like a session's created and started until its first
	// output, so the new-session rows show what the engine's own growth is.
	engine1 *Measure
	engineN *Measure
}

func newFlatStats(backend string, n int) flatStats {
	f := flatStats{
		exec1: newMeasure(fmt.Sprintf("boxrt %s: exec `true`, 1 session", backend)),
		execN: newMeasure(fmt.Sprintf("boxrt %s: exec `true` on one session, %d alive", backend, n)),
		new1:  newMeasure(fmt.Sprintf("boxrt %s: new session → first output, no other session", backend)),
		newN:  newMeasure(fmt.Sprintf("boxrt %s: new session → first output with %d sessions", backend, n)),
	}
	if backend == "docker" {
		f.engine1 = newMeasure("Engine API alone: new container → first output, no session")
		f.engineN = newMeasure(fmt.Sprintf("Engine API alone: new container → first output with %d sessions", n))
	}
	return f
}

// timeNewSessions times box_exec `echo hi` on fresh session ids (each
// deleted afterwards, untimed). With eng, each is followed by one
// container of the engine alone (timed on em), so that both see the same
// moment of a shared machine.
func timeNewSessions(ctx context.Context, p *boxrtProc, m *Measure, prefix string, eng *engineNew, em *Measure) {
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
		eng.sample(ctx, em, fmt.Sprintf("%sengine-%02d", prefix, i))
	}
	if len(samples) > 0 {
		m.add(summariseSeq(samples))
	}
	eng.done(em)
}

// timeExecs times box_exec `true` on one session, call after call.
func timeExecs(ctx context.Context, p *boxrtProc, m *Measure, id string) {
	timeOps(ctx, m, flatSamples*5, func(int) error {
		_, err := boxExec(ctx, p.rpc, id, "true")
		return err
	})
}

// before times the one-session side on the warm-up session warm.
func (f flatStats) before(ctx context.Context, p *boxrtProc, warm, prefix string, eng *engineNew) {
	timeExecs(ctx, p, f.exec1, warm)
	timeNewSessions(ctx, p, f.new1, prefix+"new1-", eng, f.engine1)
}

// after times the N-session side, the execs on one of them (one):
// what a session's next command costs with N alive.
func (f flatStats) after(ctx context.Context, p *boxrtProc, one, prefix string, eng *engineNew) {
	timeExecs(ctx, p, f.execN, one)
	timeNewSessions(ctx, p, f.newN, prefix+"newN-", eng, f.engineN)
}

// flatRows compare each side within the same boxrt.
func flatRows(s *scaleStats) []Row {
	rows := []Row{
		{Case: fmt.Sprintf("%s: exec `true` with %d sessions vs 1 session", s.backend, s.n), Boxrt: s.flat.execN, Base: s.flat.exec1},
		{Case: fmt.Sprintf("%s: first exec in each of %d sessions vs again in 1 session", s.backend, s.n), Boxrt: s.exec, Base: s.flat.exec1},
		{Case: fmt.Sprintf("%s: new session → first output with %d sessions vs none", s.backend, s.n), Boxrt: s.flat.newN, Base: s.flat.new1},
	}
	if s.flat.engineN != nil {
		rows = append(rows,
			Row{Case: fmt.Sprintf("%s: engine alone, new container → first output with %d sessions vs none", s.backend, s.n), Boxrt: s.flat.engineN, Base: s.flat.engine1},
			Row{Case: fmt.Sprintf("%s: new session → first output with %d sessions, boxrt vs the engine alone", s.backend, s.n), Boxrt: s.flat.newN, Base: s.flat.engineN})
	}
	return rows
}

// flatGoals are issue 40's "flat in sessions": an exec and a new session
// cost the same with N sessions alive as with one (p50 within 1.3×).
func flatGoals(s *scaleStats) []Goal {
	return []Goal{
		ratioGoal(fmt.Sprintf("%d sessions: %s exec `true` p50 ≤ 1.3× with one session", s.n, s.backend), s.flat.execN, s.flat.exec1, 1.3),
		ratioGoal(fmt.Sprintf("%d sessions: %s new session → first output p50 ≤ 1.3× with none", s.n, s.backend), s.flat.newN, s.flat.new1, 1.3),
	}
}
