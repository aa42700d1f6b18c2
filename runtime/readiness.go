package runtime

import (
	"context"
	"fmt"

	"github.com/boxrt/boxrt/backends"
)

// ReadinessProber is what a backend implements to take part in LangBot's
// grant-enforced mode (bwrap does, standing in for the reference's
// nsjail): a strict readiness report measured over a directory of the
// managed workspace root. A backend without it is never ready there.
type ReadinessProber interface {
	StrictReadiness(ctx context.Context, workspace string) backends.StrictReadiness
}

// StrictReadiness asks the selected backend for its strict readiness over
// workspace. A backend that is unavailable, or has no probe, reports every
// fact false with the reason in Error. name is the backend's ("" when none
// is selected).
func (r *Runtime) StrictReadiness(ctx context.Context, workspace string) (name string, rep backends.StrictReadiness) {
	b, err := r.backends.ensure(ctx)
	if err != nil {
		return "", backends.StrictReadiness{CgroupLimits: []string{}, Error: err.Error()}
	}
	name = b.Name()
	info := r.BackendInfo()
	p, ok := b.(ReadinessProber)
	switch {
	case !info.Available:
		return name, backends.StrictReadiness{CgroupLimits: []string{}, Error: fmt.Sprintf("backend %s is unavailable: %s", name, info.Error)}
	case !ok:
		return name, backends.StrictReadiness{Available: true, CgroupLimits: []string{},
			Error: fmt.Sprintf("backend %s has no strict readiness probe", name)}
	}
	rep = p.StrictReadiness(ctx, workspace)
	rep.Available = true
	return name, rep
}
