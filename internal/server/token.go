package server

import (
	"fmt"
	"path/filepath"

	"github.com/boxrt/boxrt/internal/controltoken"
)

// controlToken is the token every authenticated route checks.
type controlToken struct {
	value string
	// generated: boxrt made it up (nobody configured one).
	generated bool
	// file holds a generated token of a --listen runtime; "" otherwise.
	file string
}

// generateToken makes up the control token when none is configured: in
// stdio mode a fresh one the host learns over stdio; otherwise the one kept
// in the state directory, created there when missing, so a developer's
// client keeps working across restarts.
func generateToken(stdio bool, stateDir string) (controlToken, error) {
	if stdio {
		return controlToken{value: controltoken.Random(), generated: true}, nil
	}
	path := filepath.Join(stateDir, controltoken.FileName)
	if tok, err := controltoken.ReadFile(path, true); err == nil {
		return controlToken{value: tok, generated: true, file: path}, nil
	}
	tok := controltoken.Random()
	if err := controltoken.WriteFile(path, tok); err != nil {
		return controlToken{}, fmt.Errorf("cannot keep the generated control token in %s: %v (set BOXRT_CONTROL_TOKEN or --token-file instead)", path, err)
	}
	return controlToken{value: tok, generated: true, file: path}, nil
}
