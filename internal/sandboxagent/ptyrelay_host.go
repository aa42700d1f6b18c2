package sandboxagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// maxPendingResizes bounds the resizes of one process waiting for the
// agent's answer (each waits at most the answer timeout, or its ctx).
const maxPendingResizes = 16

// TermSize is the size of a terminal the agent makes (SpawnRequest.Term,
// RunRequest.TTY), in character cells.
type TermSize struct {
	Rows, Cols uint16
}

func (s *TermSize) wire() *termSize {
	if s == nil {
		return nil
	}
	return &termSize{Rows: int(s.Rows), Cols: int(s.Cols)}
}

// validateTerm checks a request for a terminal the agent makes.
func (req *SpawnRequest) validateTerm() error {
	switch {
	case req.TTY:
		return errors.New("TTY and Term are exclusive")
	case req.Stdin == nil || req.Stdout == nil || req.Stderr != nil:
		return errors.New("with Term, Stdin and Stdout are the pipes' ends and Stderr is nil")
	}
	return req.Term.wire().validate()
}

// Resize sizes the terminal the agent made for p (SpawnRequest.Term,
// RunRequest.TTY) and
// waits (at most 5 s, and ctx) for the agent to say it did, so that what
// the caller sends next reaches a terminal of the new size. No answer in
// time is a *ProtocolError and ends the connection.
func (p *Proc) Resize(ctx context.Context, size TermSize) error {
	if !p.term && (p.stream == nil || !p.stream.tty) {
		return errors.New("sandbox resize: the process has no terminal the agent made")
	}
	ts := size.wire()
	if err := ts.validate(); err != nil {
		return fmt.Errorf("sandbox resize: %w", err)
	}
	payload, err := json.Marshal(resizeMsg{Op: opResize, ID: p.id, termSize: *ts})
	if err != nil {
		return err
	}
	answer, err := p.c.sendResize(p.id, payload)
	if err != nil {
		return err
	}
	timer := time.NewTimer(p.c.timeout)
	defer timer.Stop()
	select {
	case <-answer:
		return nil
	case <-p.c.done:
		return p.c.Err()
	case <-timer.C:
		err := &ProtocolError{Reason: fmt.Sprintf("no answer to resize %d within %s", p.id, p.c.timeout)}
		p.c.fail(err)
		return err
	case <-ctx.Done():
		// The answer, when it comes, is taken quietly.
		return ctx.Err()
	}
}

// sendResize registers a resize of spawn id and sends it, in one order
// for both: the agent answers in the order it got them.
func (c *Conn) sendResize(id uint64, payload []byte) (<-chan struct{}, error) {
	c.resizeMu.Lock()
	defer c.resizeMu.Unlock()
	answer := make(chan struct{}, 1)
	c.mu.Lock()
	switch {
	case c.err != nil:
		c.mu.Unlock()
		return nil, c.Err()
	case len(c.resizes[id]) >= maxPendingResizes:
		c.mu.Unlock()
		return nil, fmt.Errorf("sandbox resize: %d resizes of process %d are waiting for the agent already", maxPendingResizes, id)
	}
	c.resizes[id] = append(c.resizes[id], answer)
	c.mu.Unlock()
	if err := c.send(payload, nil); err != nil {
		return nil, err
	}
	return answer, nil
}

// resized takes the agent's answer to the oldest resize of spawn id.
func (c *Conn) resized(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	waiting := c.resizes[id]
	if len(waiting) == 0 {
		return &ProtocolError{Reason: fmt.Sprintf("resized for id %d, which has no resize waiting", id)}
	}
	waiting[0] <- struct{}{}
	if len(waiting) == 1 {
		delete(c.resizes, id)
	} else {
		c.resizes[id] = waiting[1:]
	}
	return nil
}
