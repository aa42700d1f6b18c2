package actions

import (
	"encoding/json"

	"github.com/boxrt/boxrt/runtime/boxerr"
)

// backendAliases maps the LangBot host's backend names onto boxrt's.
// "local" and "docker" are boxrt's names already; nsjail's place is taken
// by bwrap, boxrt's daemonless backend.
var backendAliases = map[string]string{"nsjail": "bwrap"}

// backendAliasNotes is what box_get_backend_info says about a mapped or
// missing backend.
var backendAliasNotes = map[string]string{
	"nsjail": "boxrt runs LangBot's nsjail backend as bwrap (bubblewrap): the same daemonless isolation without nsjail's cgroup limits",
	"e2b":    "boxrt has no E2B backend; configure docker, nsjail (bwrap) or local",
}

// unavailableBackends are LangBot backend names boxrt accepts in its
// configuration (so the host's handshake succeeds) but cannot run: every
// sandbox action then fails with BoxBackendUnavailableError, as the
// reference fails when its forced backend is unavailable.
var unavailableBackends = map[string]bool{"e2b": true}

// TranslateLangBotConfig rewrites the host's box: section for boxrt's
// configuration: a LangBot backend name is mapped (nsjail → bwrap) or, for
// one boxrt cannot run (e2b), left out. requested is the name the host
// asked for when it was mapped or left out, "" otherwise. A patch that is
// not an object is returned as is, for the config's own error.
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
	switch {
	case unavailableBackends[name]:
		delete(members, "backend")
	case backendAliases[name] != "":
		members["backend"], _ = json.Marshal(backendAliases[name])
	default:
		return patch, "", nil
	}
	out, err = json.Marshal(members)
	if err != nil {
		return nil, "", boxerr.Failure("cannot rewrite the configuration: %v", err).Wrap(err)
	}
	return out, name, nil
}

// errBackendUnavailable is the refusal of a sandbox action while the host
// asked for a backend boxrt does not have.
func errBackendUnavailable(name string) error {
	return boxerr.BackendUnavailable("LangBot Box backend %s is unavailable: %s", name, backendAliasNotes[name])
}
