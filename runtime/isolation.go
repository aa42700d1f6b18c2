package runtime

import (
	"context"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// isolationTimeout bounds one measurement of every level of a backend.
const isolationTimeout = 3 * time.Minute

// IsolationProber is what a backend implements to have its isolation
// measured (docker and bwrap do, with backends.MeasureIsolation). A
// backend without it reports no measurement rather than a guess.
type IsolationProber interface {
	MeasureIsolation(ctx context.Context) []backends.IsolationReport
}

// isolationState caches the isolation reports of the selected backend.
// They are measured once per backend, in the background, the first time
// box_get_backend_info asks: a probe starts a real sandbox, which no RPC
// should wait for and which a runtime nobody asks should not pay.
type isolationState struct {
	backend backends.Backend // the backend the reports (or the run) are for
	running bool
	reports []backends.IsolationReport
}

// isolationLocked returns the cached reports of b and whether they are
// still being measured, starting a measurement when there is none and
// start is set. s.mu is held.
func (s *backendSelector) isolationLocked(b backends.Backend, start bool) ([]backends.IsolationReport, bool) {
	if s.iso.backend == b {
		return s.iso.reports, s.iso.running
	}
	p, ok := b.(IsolationProber)
	if !start || !ok || s.bgCtx == nil || !s.life.enter(s.bg) {
		return nil, false
	}
	s.iso = isolationState{backend: b, running: true}
	bgCtx := s.bgCtx
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(bgCtx, isolationTimeout)
		reports := p.MeasureIsolation(ctx)
		cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.iso.backend == b {
			s.iso.reports, s.iso.running = reports, false
		}
	}()
	return nil, true
}
