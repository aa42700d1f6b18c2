package actions

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/skills"
)

// backendAliases maps the LangBot host's backend names onto boxrt's.
// "local" and "docker" are boxrt's names already; nsjail's place is taken
// by bwrap, boxrt's daemonless backend.
var backendAliases = map[string]string{"nsjail": "bwrap"}

// backendAliasNotes is what box_get_backend_info says about a mapped
// backend.
var backendAliasNotes = map[string]string{
	"nsjail": "boxrt runs LangBot's nsjail backend as bwrap (bubblewrap): the same daemonless isolation, with cgroup limits on cgroup v1 and v2",
}

// TranslateLangBotConfig rewrites the host's box: section for boxrt's
// configuration: a LangBot backend name is mapped (nsjail → bwrap; e2b,
// local, docker are boxrt's names already). requested is the name the
// host asked for when it was mapped, "" otherwise. A patch that is not an
// object is returned as is, for the config's own error.
func TranslateLangBotConfig(patch json.RawMessage) (out json.RawMessage, requested string, err error) {
	var members map[string]json.RawMessage
	if json.Unmarshal(patch, &members) != nil || members == nil {
		return patch, "", nil
	}
	raw, ok := members["backend"]
	if !ok {
		return patch, "", nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return patch, "", nil // not a string: the config's decoder names it
	}
	if backendAliases[name] == "" {
		return patch, "", nil
	}
	members["backend"], _ = json.Marshal(backendAliases[name])
	out, err = json.Marshal(members)
	if err != nil {
		return nil, "", boxerr.Failure("cannot rewrite the configuration: %v", err).Wrap(err)
	}
	return out, name, nil
}

// FitLangBotMountRoots adapts the host's local.allowed_mount_roots to
// boxrt's stricter rule. LangBot's default (["./data/box", "/tmp"], with the
// reference's skill store at ./data/box/skills, or boxrt's under a state
// directory in /tmp) may name a root that holds the skill store, which
// boxrt refuses (every session could rewrite the skills), so
// the host's box_init — and the whole handshake — would fail. A root that
// holds the skill store is narrowed to the default workspace when that lies
// under it (the host mounts only <default_workspace>/tenants/… there), and
// dropped otherwise; a root inside the skill store is dropped. base is the
// configuration the patch applies to; notes say what changed, for the log.
func FitLangBotMountRoots(base runtime.Config, patch json.RawMessage) (json.RawMessage, []string) {
	var members map[string]json.RawMessage
	if json.Unmarshal(patch, &members) != nil || members == nil {
		return patch, nil
	}
	var local map[string]json.RawMessage
	if json.Unmarshal(members["local"], &local) != nil || local == nil || local["allowed_mount_roots"] == nil {
		return patch, nil
	}
	eff := base
	paths := struct {
		HostRoot         *string `json:"host_root"`
		DefaultWorkspace *string `json:"default_workspace"`
		SkillsRoot       *string `json:"skills_root"`
	}{&eff.Local.HostRoot, &eff.Local.DefaultWorkspace, &eff.Local.SkillsRoot}
	if json.Unmarshal(members["local"], &paths) != nil {
		return patch, nil // the config's decoder words the error
	}
	var roots runtime.StringList
	if json.Unmarshal(local["allowed_mount_roots"], &roots) != nil {
		return patch, nil // the config's decoder words the error
	}
	// skills.ResolveRoot(".", p) is p made absolute against the working
	// directory, "~" expanded: how the runtime reads a root.
	abs := func(p string) string { return skills.ResolveRoot(".", p) }
	store := eff.SkillStoreRoot()
	workspace := abs(eff.DefaultWorkspace())
	fitted := make([]string, 0, len(roots))
	var notes []string
	for _, r := range roots {
		root := abs(r)
		switch {
		case within(store, root) && within(workspace, root) && !within(workspace, store):
			if !slices.Contains(fitted, workspace) {
				fitted = append(fitted, workspace)
			}
			notes = append(notes, fmt.Sprintf("local.allowed_mount_roots %q holds the skill store %s: narrowed to the default workspace %s", r, store, workspace))
		case within(store, root) || within(root, store):
			notes = append(notes, fmt.Sprintf("local.allowed_mount_roots %q overlaps the skill store %s: left out", r, store))
		default:
			fitted = append(fitted, r)
		}
	}
	if notes == nil {
		return patch, nil
	}
	local["allowed_mount_roots"], _ = json.Marshal(fitted)
	members["local"], _ = json.Marshal(local)
	out, err := json.Marshal(members)
	if err != nil {
		return patch, nil
	}
	return out, notes
}

// within reports whether p is root or lies under it.
func within(p, root string) bool {
	return p == root || root == "/" || strings.HasPrefix(p, strings.TrimSuffix(root, "/")+"/")
}
