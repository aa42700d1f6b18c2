package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/runtime"
)

// loadConfig reads the configuration of serve and doctor for a runtime of
// state directory stateDir: the defaults, then --config, then
// LANGBOT_BOX_CONFIG and BOXRT_CONFIG, each a patch over the one before.
func loadConfig(file, stateDir string) (runtime.Config, error) {
	cfg := runtime.DefaultConfig().WithStateDir(stateDir)
	var patches []struct {
		from  string
		patch json.RawMessage
	}
	if file != "" {
		p, err := runtime.LoadFile(file)
		if err != nil {
			return cfg, &exitError{code: 2, msg: err.Error()}
		}
		patches = append(patches, struct {
			from  string
			patch json.RawMessage
		}{"--config " + file, p})
	}
	for _, env := range []string{"LANGBOT_BOX_CONFIG", "BOXRT_CONFIG"} {
		if v := strings.TrimSpace(os.Getenv(env)); v != "" {
			patches = append(patches, struct {
				from  string
				patch json.RawMessage
			}{env, json.RawMessage(v)})
		}
	}
	for _, p := range patches {
		// The host's backend names (nsjail, e2b, host) become boxrt's.
		patch, _, err := actions.TranslateLangBotConfig(p.patch)
		if err != nil {
			return cfg, &exitError{code: 2, msg: fmt.Sprintf("%s: %v", p.from, err)}
		}
		if p.from == "LANGBOT_BOX_CONFIG" {
			// The host's default mount roots hold its skill store.
			var notes []string
			patch, notes = actions.FitLangBotMountRoots(cfg, patch)
			for _, n := range notes {
				fmt.Fprintf(os.Stderr, "boxrt: LANGBOT_BOX_CONFIG: %s\n", n)
			}
		}
		next, ignored, err := cfg.Merge(patch, actions.DecodeParams)
		if err != nil {
			return cfg, &exitError{code: 2, msg: fmt.Sprintf("%s: %v", p.from, err)}
		}
		if len(ignored) > 0 {
			fmt.Fprintf(os.Stderr, "boxrt: %s: ignoring keys boxrt does not use: %s\n", p.from, strings.Join(ignored, ", "))
		}
		cfg = next
	}
	return cfg, nil
}
