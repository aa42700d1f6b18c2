package reconnect

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/sourcegraph/jsonrpc2"
)

// OutputNotification is the method of boxrt's exec output notifications.
const OutputNotification = "box_exec_output"

// ExecOutput is one chunk of an exec's output (a box_exec_output
// notification, its data decoded), or the end of the stream: EOF when the
// exec's output is complete, Err when the link carrying it was lost (the
// exec itself goes on in boxrt: re-attach with box_exec_attach from
// Seq+1 of the last chunk received).
type ExecOutput struct {
	ExecID string
	Seq    int64
	// Stream is "stdout" or "stderr" (a terminal's output is all stdout).
	Stream string
	// Offset is how many bytes of Stream came before this chunk.
	Offset int64
	Data   []byte
	EOF    bool
	Err    error
}

// OutputParams is a box_exec_output notification's params as they travel:
// Data when the chunk is valid UTF-8, else DataBase64. Output decodes
// them; a client that reads the notifications itself uses both.
type OutputParams struct {
	ExecID     string          `json:"exec_id"`
	RequestID  json.RawMessage `json:"request_id"`
	Seq        int64           `json:"seq"`
	Stream     string          `json:"stream"`
	Offset     int64           `json:"offset"`
	Data       *string         `json:"data"`
	DataBase64 string          `json:"data_base64"`
	EOF        bool            `json:"eof"`
}

// Output is the chunk p carries, its data decoded (Err says why it could
// not be).
func (p OutputParams) Output() ExecOutput {
	out := ExecOutput{ExecID: p.ExecID, Seq: p.Seq, Stream: p.Stream, Offset: p.Offset, EOF: p.EOF}
	switch {
	case p.Data != nil:
		out.Data = []byte(*p.Data)
	case p.DataBase64 != "":
		b, err := base64.StdEncoding.DecodeString(p.DataBase64)
		if err != nil {
			out.Err = fmt.Errorf("reconnect: undecodable data_base64 in chunk %d of exec %s: %w", p.Seq, p.ExecID, err)
		}
		out.Data = b
	}
	return out
}

// streams routes output notifications to the CallStream that caused them,
// by the request id the call picked, which boxrt names in every chunk.
type streams struct {
	mu   sync.Mutex
	next uint64
	subs map[string]*streamSub
}

type streamSub struct {
	l  *link
	fn func(ExecOutput)
}

func (s *streams) add(l *link, fn func(ExecOutput)) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id := fmt.Sprintf("stream-%d", s.next)
	if s.subs == nil {
		s.subs = map[string]*streamSub{}
	}
	s.subs[id] = &streamSub{l: l, fn: fn}
	return id
}

func (s *streams) remove(id string) *streamSub {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := s.subs[id]
	delete(s.subs, id)
	return sub
}

func (s *streams) get(id string) *streamSub {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs[id]
}

// lost ends the streams of a link that died.
func (s *streams) lost(l *link, cause error) {
	s.mu.Lock()
	var ended []*streamSub
	for id, sub := range s.subs {
		if sub.l == l {
			ended = append(ended, sub)
			delete(s.subs, id)
		}
	}
	s.mu.Unlock()
	for _, sub := range ended {
		sub.fn(ExecOutput{Err: unavailable(cause, "exec output stream lost with its link to boxrt")})
	}
}

// deliver routes one output notification; it runs on the link's reader.
func (s *streams) deliver(raw json.RawMessage) {
	var p OutputParams
	if json.Unmarshal(raw, &p) != nil {
		return
	}
	var id string
	if json.Unmarshal(p.RequestID, &id) != nil {
		return // not one of ours (a number: another client's request)
	}
	s.route(id, p.Output())
}

// route hands out to the CallStream whose request id is id, if any.
func (s *streams) route(id string, out ExecOutput) {
	var sub *streamSub
	if out.EOF {
		sub = s.remove(id)
	} else {
		sub = s.get(id)
	}
	if sub != nil {
		sub.fn(out)
	}
}

// CallStream is Call for the methods that stream an exec's output to the
// caller's connection: box_exec with "stream": true, box_exec_start with
// "stream": true, and box_exec_attach. onOutput gets the exec's chunks in
// order, then one last ExecOutput with EOF (the output is complete) or
// Err (the call failed, or the link was lost: the exec goes on in boxrt;
// re-attach from the last Seq+1 once reconnected). The chunks may begin
// before CallStream returns, and for box_exec_start and box_exec_attach
// go on after it.
//
// onOutput runs on the link's reading goroutine, in order: it must not
// block (hand the data to a channel or buffer of your own), or responses
// and heartbeats wait behind it.
func (c *Client) CallStream(ctx context.Context, method string, params, result any, onOutput func(ExecOutput)) error {
	l, err := c.await(ctx, method)
	if err != nil {
		return err
	}
	id := c.streams.add(l, onOutput)
	err = l.call(ctx, method, params, result, jsonrpc2.PickID(jsonrpc2.ID{Str: id, IsString: true}))
	if err != nil {
		if sub := c.streams.remove(id); sub != nil {
			sub.fn(ExecOutput{Err: err})
		}
	}
	return err
}
