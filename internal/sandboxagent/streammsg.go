package sandboxagent

import (
	"errors"
	"fmt"
)

// Stream mode: where no descriptor can cross to the sandbox (a Kubernetes
// Pod reached through one exec, whose stdin and stdout carry the frames),
// the agent makes a child's pipes or terminal itself and the bytes travel
// as frames. Each direction is windowed: a side sends at most streamWindow
// bytes of a process's data the other has not yet acknowledged with a
// credit frame, so neither buffers more than that for a slow reader.
//
//	host → agent  run    {id, argv, env, dir, tty, rows, cols}  → started | failed
//	agent → host  output {id, fd, data}     fd 1 or 2 (a terminal: 1)
//	host → agent  credit {id, bytes}        output written to the caller
//	host → agent  input  {id, data, eof}    stdin bytes, then its end
//	agent → host  credit {id, bytes}        stdin written to the child
//	host → agent  resize {id, rows, cols}   the terminal's size
//	agent → host  exited                    after the process's last output

const (
	opRun    = "run"
	opOutput = "output"
	opInput  = "input"
	opCredit = "credit"
)

const (
	// streamChunk bounds the data of one output or input frame: base64
	// makes it a third larger, and a frame holds 64 KiB.
	streamChunk = 32 << 10
	// streamWindow is how many bytes of one process's output (or input)
	// may be in flight, unacknowledged, at once.
	streamWindow = 256 << 10
)

// runMsg is spawnMsg without descriptors: the agent makes the pipes, or a
// terminal of Rows×Cols.
type runMsg struct {
	Op   string   `json:"op"`
	ID   uint64   `json:"id"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	TTY  bool     `json:"tty"`
	Rows uint16   `json:"rows"`
	Cols uint16   `json:"cols"`
	// Inherit: Env is laid over the agent's own environment (a Pod's
	// container environment, which boxrt does not know).
	Inherit bool `json:"inherit,omitempty"`
	// LongArg: the last argument came ahead in arg frames (longarg.go).
	LongArg bool `json:"long_arg,omitempty"`
}

type outputMsg struct {
	Op   string `json:"op"`
	ID   uint64 `json:"id"`
	FD   int    `json:"fd"`
	Data []byte `json:"data"`
}

type inputMsg struct {
	Op   string `json:"op"`
	ID   uint64 `json:"id"`
	Data []byte `json:"data,omitempty"`
	EOF  bool   `json:"eof,omitempty"`
}

type creditMsg struct {
	Op    string `json:"op"`
	ID    uint64 `json:"id"`
	Bytes int    `json:"bytes"`
}

// validate checks an output frame against what the process may send: its
// terminal has one stream, and owed is the window it has left.
func (m *outputMsg) validate(tty bool, owed int) error {
	switch {
	case m.FD != 1 && (m.FD != 2 || tty):
		return fmt.Errorf("fd %d is not an output of the process", m.FD)
	case len(m.Data) == 0 || len(m.Data) > streamChunk:
		return fmt.Errorf("%d bytes of data, want 1..%d", len(m.Data), streamChunk)
	case len(m.Data) > owed:
		return fmt.Errorf("%d bytes of data with %d bytes of window left", len(m.Data), owed)
	}
	return nil
}

// validate checks a credit frame against the bytes in flight.
func (m *creditMsg) validate(inFlight int) error {
	if m.Bytes <= 0 || m.Bytes > inFlight {
		return fmt.Errorf("credit of %d bytes with %d in flight", m.Bytes, inFlight)
	}
	return nil
}

func (m *runMsg) validate() error {
	if m.TTY && (m.Rows == 0 || m.Cols == 0) {
		return errors.New("a terminal needs rows and cols")
	}
	return nil
}
