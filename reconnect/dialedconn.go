package reconnect

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"

	"github.com/boxrt/boxrt/internal/dialout"
)

// AnswersLostNotification is what a dialed-in runtime sends after a
// resumption that could not replay every answer: params {"ids": [the
// requests' ids], "notifications_lost": n}. The Client fails those calls
// itself (ErrRuntimeUnavailable, not retryable: they ran); the
// notification also reaches WithOnNotification.
const AnswersLostNotification = dialout.AnswersLostNotification

// dialedConn adapts a dial-out logical connection to the link's
// frameConn, and turns what a resumption lost into error answers for the
// calls waiting on them.
type dialedConn struct {
	c *dialout.Conn

	mu     sync.Mutex
	inject [][]byte // error answers to deliver before the next frame
}

func newDialedConn(id string) *dialedConn {
	d := &dialedConn{}
	d.c = dialout.NewConn(id, dialout.Options{Window: DialedRuntimeWindow, OnLost: func(_ string, lost dialout.Lost) ([]byte, [][]byte) {
		// Requests of ours the runtime never got: they did not run.
		return nil, errorAnswers(lost.IDs, true, "the request was lost with the connection to the dialed-in runtime (the host's replay buffer overflowed); it did not run")
	}})
	return d
}

// ReadFrame returns the error answers box_answers_lost calls for right
// after it.
func (d *dialedConn) ReadFrame() ([]byte, error) {
	if f := d.next(); f != nil {
		return f, nil
	}
	f, err := d.c.ReadFrame()
	if err == nil && bytes.Contains(f, []byte(`"`+AnswersLostNotification+`"`)) {
		d.answersLost(f)
	}
	return f, err
}

func (d *dialedConn) next() []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.inject) == 0 {
		return nil
	}
	f := d.inject[0]
	d.inject = d.inject[1:]
	return f
}

func (d *dialedConn) answersLost(frame []byte) {
	var m struct {
		Method string `json:"method"`
		Params struct {
			IDs []json.RawMessage `json:"ids"`
		} `json:"params"`
	}
	if json.Unmarshal(frame, &m) != nil || m.Method != AnswersLostNotification {
		return
	}
	// Bounded by what the runtime remembers of its evictions; more is not
	// believed.
	answers := errorAnswers(m.Params.IDs[:min(len(m.Params.IDs), 1<<13)], false, "the answer was lost while the dialed-in runtime was disconnected (its replay buffer overflowed); the call ran")
	d.mu.Lock()
	d.inject = append(d.inject, answers...)
	d.mu.Unlock()
}

// errorAnswers is an error answer for each id.
func errorAnswers(ids []json.RawMessage, retryable bool, msg string) [][]byte {
	type data struct {
		Type      string `json:"type"`
		Retryable bool   `json:"retryable"`
	}
	type wireErr struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
		Data    data   `json:"data"`
	}
	var out [][]byte
	for _, id := range ids {
		if !json.Valid(id) {
			continue
		}
		f, err := json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   wireErr         `json:"error"`
		}{"2.0", id, wireErr{ErrRuntimeUnavailable.Code, ErrRuntimeUnavailable.Type + ": " + msg, data{ErrRuntimeUnavailable.Type, retryable}}})
		if err == nil {
			out = append(out, f)
		}
	}
	return out
}

func (d *dialedConn) WriteFrame(_ context.Context, b []byte) (int, error) {
	if err := d.c.WriteFrame(b); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (d *dialedConn) Close() error { return d.c.Close() }
