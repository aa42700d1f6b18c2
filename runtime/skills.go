package runtime

import (
	"context"
	"path"
	"slices"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// SkillResolver maps a skill name to its package directory on this host.
// The skill store implements it.
type SkillResolver interface {
	PackageRoot(ctx context.Context, name string) (string, error)
}

// WithSkillResolver plugs in the skill store; without one, specs naming
// skills are refused.
func WithSkillResolver(sr SkillResolver) Option { return func(r *Runtime) { r.skills = sr } }

// resolveSkills turns spec.SkillName (read-only, the reference's field) and
// spec.Skills into mounts at <mount_path>/.skills/<name>.
func resolveSkills(ctx context.Context, sr SkillResolver, spec Spec) ([]backends.MountSpec, error) {
	wanted := slices.Clone(spec.Skills)
	if spec.SkillName != "" {
		wanted = append([]SkillMount{{Name: spec.SkillName, Mode: backends.MountRO}}, wanted...)
	}
	if len(wanted) == 0 {
		return nil, nil
	}
	if sr == nil {
		return nil, boxerr.Validation("skills", "this runtime has no skill store")
	}
	var out []backends.MountSpec
	seen := map[string]bool{}
	for _, w := range wanted {
		if seen[w.Name] {
			continue
		}
		seen[w.Name] = true
		root, err := sr.PackageRoot(ctx, w.Name)
		if err != nil {
			return nil, err
		}
		// Backends re-check that a bound path resolves to itself right
		// before mounting it; a store reached through a symlink would fail
		// that check.
		if root, err = backends.ResolveExisting(root); err != nil {
			return nil, boxerr.Failure("skill %s: cannot resolve %s: %v", w.Name, root, err).Wrap(err)
		}
		mode := w.Mode
		if mode == "" {
			mode = backends.MountRO
		}
		out = append(out, backends.MountSpec{HostPath: root, MountPath: path.Join(spec.MountPath, SkillsMountDir, w.Name), Mode: mode})
	}
	return out, nil
}

// mergeMounts adds the mounts of more to base; a mount for a target base
// already has replaces it (a skill asked for with another mode).
func mergeMounts(base, more []backends.MountSpec) []backends.MountSpec {
	out := slices.Clone(base)
	for _, m := range more {
		i := slices.IndexFunc(out, func(b backends.MountSpec) bool { return b.MountPath == m.MountPath })
		if i < 0 {
			out = append(out, m)
		} else {
			out[i] = m
		}
	}
	return out
}

// splitSkillMounts separates adopted skill mounts (under
// <mount_path>/.skills/) from the caller's extra mounts.
func splitSkillMounts(info backends.Session) (user, skills []backends.MountSpec) {
	prefix := path.Join(info.MountPath, SkillsMountDir) + "/"
	for _, m := range info.ExtraMounts {
		if len(m.MountPath) > len(prefix) && m.MountPath[:len(prefix)] == prefix {
			skills = append(skills, m)
		} else {
			user = append(user, m)
		}
	}
	return user, skills
}
