package runtime

import (
	"encoding/json"
	"sync"
)

// settings hold the configuration in force; box_init replaces it whole,
// so every reader gets one consistent copy.
type settings struct {
	mu  sync.Mutex
	cfg Config
}

func (s *settings) get() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// apply merges patch into the configuration in one step (two box_inits
// never lose each other's keys) and returns the configuration before and
// after, and the keys it ignored.
func (s *settings) apply(patch json.RawMessage, decode Decoder, stateDir string) (prev, next Config, ignored []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, ignored, err = s.cfg.Merge(patch, decode)
	if err == nil {
		_, err = next.mountRoots(stateDir)
	}
	if err != nil {
		return Config{}, Config{}, nil, err
	}
	prev, s.cfg = s.cfg, next
	return prev, next, ignored, nil
}
