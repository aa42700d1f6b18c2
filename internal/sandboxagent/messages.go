package sandboxagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The protocol's messages, one JSON object per frame, told apart by op.
// Each op has its own type, decoded strictly: an unknown field, a wrong
// type or trailing data is a protocol error.

const (
	protocolVersion = 1
	maxPID          = 4194304 // the kernel's PID_MAX_LIMIT
	maxSignal       = 64
	maxArgs         = 4096  // argv and env entries each
	maxReason       = 1024  // a failed message's text
	maxTermCells    = 65535 // a terminal's rows or columns (the kernel's winsize)
)

const (
	opHello   = "hello"
	opSpawn   = "spawn"
	opStarted = "started"
	opFailed  = "failed"
	opExited  = "exited"
	opSignal  = "signal"
	opResize  = "resize"
	opResized = "resized"
)

// Agent to host.
type helloMsg struct {
	Op      string `json:"op"`
	Version int    `json:"version"`
	PID     int    `json:"pid"`
}

type startedMsg struct {
	Op  string `json:"op"`
	ID  uint64 `json:"id"`
	PID int    `json:"pid"`
}

type failedMsg struct {
	Op    string `json:"op"`
	ID    uint64 `json:"id"`
	Error string `json:"error"`
}

type resizedMsg struct {
	Op string `json:"op"`
	ID uint64 `json:"id"`
}

// exitedMsg's numbers are pointers so that a missing one is told from 0.
type exitedMsg struct {
	Op     string `json:"op"`
	ID     uint64 `json:"id"`
	Code   *int   `json:"code"`
	Signal *int   `json:"signal"`
}

// Host to agent.
type spawnMsg struct {
	Op   string   `json:"op"`
	ID   uint64   `json:"id"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	TTY  bool     `json:"tty"`
	// Term: the agent makes the terminal itself, of this size, and relays
	// it to the stdin and output pipes sent (ptyrelay.go).
	Term *termSize `json:"term,omitempty"`
	// LongArg: the last argument came ahead in arg frames (longarg.go).
	LongArg bool `json:"long_arg,omitempty"`
}

// descriptors is how many descriptors a spawn carries: the pty slave;
// the stdin and output pipes of a terminal the agent makes; or stdin,
// stdout and stderr.
func (m *spawnMsg) descriptors() (int, error) {
	switch {
	case m.TTY && m.Term != nil:
		return 0, &ProtocolError{Reason: fmt.Sprintf("spawn %d: tty and term are exclusive", m.ID)}
	case m.TTY:
		return 1, nil
	case m.Term != nil:
		if err := m.Term.validate(); err != nil {
			return 0, &ProtocolError{Reason: fmt.Sprintf("spawn %d: %v", m.ID, err)}
		}
		return 2, nil
	}
	return 3, nil
}

// termSize is a terminal's size in character cells, each 1..maxTermCells.
type termSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

func (s *termSize) validate() error {
	if s.Rows < 1 || s.Rows > maxTermCells || s.Cols < 1 || s.Cols > maxTermCells {
		return fmt.Errorf("terminal size %dx%d is outside 1..%d", s.Rows, s.Cols, maxTermCells)
	}
	return nil
}

// resizeMsg sizes the terminal the agent made for spawn id; the agent
// answers resized once the size is set (or the terminal is gone).
type resizeMsg struct {
	Op string `json:"op"`
	ID uint64 `json:"id"`
	termSize
}

type signalMsg struct {
	Op     string `json:"op"`
	ID     uint64 `json:"id"`
	Signal int    `json:"signal"`
}

// opOf is the op of a frame, read leniently: the strict decoding of its
// type comes next.
func opOf(payload []byte) (string, error) {
	var m struct {
		Op string `json:"op"`
	}
	if err := json.Unmarshal(payload, &m); err != nil {
		return "", &ProtocolError{Reason: "invalid JSON: " + err.Error()}
	}
	return m.Op, nil
}

// decodeStrict decodes payload, a frame of op, into v.
func decodeStrict(op string, payload []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(payload))
	d.DisallowUnknownFields()
	err := d.Decode(v)
	if err == nil {
		if _, terr := d.Token(); !errors.Is(terr, io.EOF) {
			err = errors.New("data after the JSON object")
		}
	}
	if err != nil {
		return &ProtocolError{Reason: fmt.Sprintf("%s: %v", op, err)}
	}
	return nil
}

func (m *helloMsg) validate() error {
	if m.Version != protocolVersion {
		return fmt.Errorf("version %d, want %d", m.Version, protocolVersion)
	}
	return checkPID(m.PID)
}

func (m *startedMsg) validate() error { return checkPID(m.PID) }

func (m *failedMsg) validate() error {
	if m.Error == "" || len(m.Error) > maxReason || !utf8.ValidString(m.Error) {
		return fmt.Errorf("error text must be 1..%d bytes of UTF-8, got %d bytes", maxReason, len(m.Error))
	}
	return nil
}

func (m *exitedMsg) validate() error {
	switch {
	case m.Code == nil || m.Signal == nil:
		return errors.New("code and signal are required")
	case *m.Code < 0 || *m.Code > 255:
		return fmt.Errorf("exit code %d is outside 0..255", *m.Code)
	case *m.Signal < 0 || *m.Signal > maxSignal:
		return fmt.Errorf("signal %d is outside 0..%d", *m.Signal, maxSignal)
	case *m.Signal != 0 && *m.Code != 128+*m.Signal:
		return fmt.Errorf("exit code %d with signal %d, want %d", *m.Code, *m.Signal, 128+*m.Signal)
	}
	return nil
}

func checkPID(pid int) error {
	if pid <= 0 || pid > maxPID {
		return fmt.Errorf("pid %d is outside 1..%d", pid, maxPID)
	}
	return nil
}

// checkStrings bounds a list of strings execve takes: a count, and no NUL.
func checkStrings(what string, list []string) error {
	if len(list) > maxArgs {
		return fmt.Errorf("%s has %d entries, at most %d", what, len(list), maxArgs)
	}
	for i, s := range list {
		if strings.IndexByte(s, 0) >= 0 {
			return fmt.Errorf("%s[%d] contains a NUL byte", what, i)
		}
	}
	return nil
}

// short quotes s for an error message, cut to a few dozen bytes: what the
// agent says is repeated, never at length.
func short(s string) string {
	const limit = 40
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "…"
	}
	return strconv.Quote(s)
}
