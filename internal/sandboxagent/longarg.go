package sandboxagent

import (
	"encoding/json"
	"fmt"
)

// A command line longer than a frame (a script an LLM wrote inline, a
// heredoc of a file) travels ahead of its spawn or run: the host sends the
// last argument in arg frames under the spawn's id, then the spawn with
// long_arg set and that argument empty; the agent puts the pieces back.
// The kernel takes no single argument over MAX_ARG_STRLEN, so neither
// does this.

const (
	opArg = "arg"
	// maxLongArg is the kernel's MAX_ARG_STRLEN (32 pages).
	maxLongArg = 32 * 4096
	// argChunk bounds one arg frame's data (base64 makes it 4/3 larger).
	argChunk = 32 << 10
	// maxPendingArgs bounds the long arguments an agent holds for spawns
	// that have not come yet.
	maxPendingArgs = 16
)

// argMsg is a piece of a spawn's (or run's) last argument.
type argMsg struct {
	Op   string `json:"op"`
	ID   uint64 `json:"id"`
	Data []byte `json:"data"`
}

// sendLongArg sends arg ahead of the spawn or run of id.
func (c *Conn) sendLongArg(id uint64, arg string) error {
	if len(arg) > maxLongArg {
		return fmt.Errorf("an argument of %d bytes is over the kernel's %d-byte limit for one argument", len(arg), maxLongArg)
	}
	for off := 0; off < len(arg); off += argChunk {
		payload, err := json.Marshal(argMsg{Op: opArg, ID: id, Data: []byte(arg[off:min(off+argChunk, len(arg))])})
		if err != nil {
			return err
		}
		if err := c.send(payload, nil); err != nil {
			return err
		}
	}
	return nil
}

// encodeLong marshals m (a spawn or run whose last argument is argv's);
// when it is over a frame, it sends that argument ahead (sendLongArg) and
// marshals m again with it left out (strip empties it and sets long_arg).
func (c *Conn) encodeLong(id uint64, m any, argv []string, strip func()) ([]byte, error) {
	payload, err := json.Marshal(m)
	if err != nil || len(payload) <= maxFrame || len(argv) == 0 {
		return payload, err
	}
	last := argv[len(argv)-1]
	strip()
	if payload, err = json.Marshal(m); err != nil {
		return nil, err
	}
	if len(payload) > maxFrame {
		return nil, fmt.Errorf("argv (but its last argument), env and dir take %d bytes encoded, over the %d-byte frame limit", len(payload), maxFrame)
	}
	return payload, c.sendLongArg(id, last)
}

// addLongArg takes an arg frame of the host's.
func (a *agent) addLongArg(m *argMsg) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.longArgs == nil {
		a.longArgs = map[uint64][]byte{}
	}
	held, ok := a.longArgs[m.ID]
	switch {
	case !ok && len(a.longArgs) >= maxPendingArgs:
		return &ProtocolError{Reason: fmt.Sprintf("arg %d: more than %d long arguments pending", m.ID, maxPendingArgs)}
	case len(m.Data) == 0 || len(m.Data) > argChunk:
		return &ProtocolError{Reason: fmt.Sprintf("arg %d: %d bytes of data, want 1..%d", m.ID, len(m.Data), argChunk)}
	case len(held)+len(m.Data) > maxLongArg:
		return &ProtocolError{Reason: fmt.Sprintf("arg %d: over %d bytes", m.ID, maxLongArg)}
	}
	a.longArgs[m.ID] = append(held, m.Data...)
	return nil
}

// takeLongArg puts the long argument sent ahead for id in place of argv's
// last (empty) one.
func (a *agent) takeLongArg(id uint64, argv []string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	arg, ok := a.longArgs[id]
	delete(a.longArgs, id)
	if !ok || len(argv) == 0 || argv[len(argv)-1] != "" {
		return &ProtocolError{Reason: fmt.Sprintf("%d: long_arg without its arg frames, or with a last argument of its own", id)}
	}
	argv[len(argv)-1] = string(arg)
	return nil
}
