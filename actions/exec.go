package actions

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

// OutputNotification is the method of the notifications that carry an
// exec's output.
const OutputNotification = "box_exec_output"

// maxTTYCells bounds a terminal's rows and columns.
const maxTTYCells = 1000

// execParams is box_exec's params: the session spec plus the live options.
type execParams struct {
	sessionSpec
	opts LiveOptions
}

// LiveOptions are the members box_exec and box_exec_start add to the spec.
// The type is exported because it is embedded in the params' wire structs:
// an exported embedded field stays out of the field paths that validation
// errors name (pty.rows, not liveOptions.pty.rows).
type LiveOptions struct {
	// Stream sends the output as box_exec_output notifications while the
	// command runs.
	Stream bool              `json:"stream"`
	PTY    *backends.TTYSize `json:"pty"`
}

func (o LiveOptions) validate() error {
	if o.PTY != nil {
		return validTTY("pty.", *o.PTY)
	}
	return nil
}

func validTTY(prefix string, sz backends.TTYSize) error {
	if sz.Rows < 1 || sz.Rows > maxTTYCells {
		return boxerr.Validation(prefix+"rows", "%srows must be between 1 and %d, got %d", prefix, maxTTYCells, sz.Rows)
	}
	if sz.Cols < 1 || sz.Cols > maxTTYCells {
		return boxerr.Validation(prefix+"cols", "%scols must be between 1 and %d, got %d", prefix, maxTTYCells, sz.Cols)
	}
	return nil
}

// decodeParams decodes the spec, which is normalised after admission (in
// validate), and checks the live options, which admission leaves alone.
func (p *execParams) decodeParams(raw json.RawMessage) error {
	w := struct {
		WireSpec
		LiveOptions
	}{WireSpec: WireSpec{Spec: runtime.DefaultSpec()}}
	err := p.decodeMembers(raw, &w.WireSpec, &w)
	p.opts = w.LiveOptions
	if err != nil {
		return err
	}
	return p.opts.validate()
}

// exec runs a command in a session, creating or reusing it. With stream,
// its output is also sent as notifications (all of them before the
// result); a cancelled request kills the command and answers status
// canceled.
func (d *Dispatcher) exec(ctx context.Context, p execParams) (runtime.ExecResult, error) {
	// A terminal's input is the host's to type (box_exec_write_stdin with
	// the exec id its chunks carry).
	opts := runtime.ExecOptions{PTY: p.opts.PTY, Stdin: p.opts.PTY != nil}
	if p.opts.Stream {
		opts.Sink = outputSink(ctx)
	}
	if p.spec.Network.Egress() { // a session's spec names its network
		defer d.watchNetwork(ctx, p.spec.SessionID)()
	}
	return d.rt.Execs().ExecWith(ctx, p.spec, opts)
}

// startParams is box_exec_start's: box_exec's plus stdin.
type startParams struct {
	sessionSpec
	opts  LiveOptions
	stdin bool
}

func (p *startParams) decodeParams(raw json.RawMessage) error {
	spec := runtime.DefaultSpec()
	spec.TimeoutSec = runtime.DefaultBackgroundTimeoutSec
	w := struct {
		WireSpec
		LiveOptions
		Stdin bool `json:"stdin"`
	}{WireSpec: WireSpec{Spec: spec}}
	err := p.decodeMembers(raw, &w.WireSpec, &w)
	p.opts, p.stdin = w.LiveOptions, w.Stdin
	if err != nil {
		return err
	}
	return p.opts.validate()
}

// startExec starts a background exec and returns its id at once. With
// stream, this connection gets its output from the first byte.
func (d *Dispatcher) startExec(ctx context.Context, p startParams) (runtime.ExecInfo, error) {
	// A terminal's input is the host's to type: it is always open.
	opts := runtime.ExecOptions{PTY: p.opts.PTY, Stdin: p.stdin || p.opts.PTY != nil}
	if p.opts.Stream {
		opts.Sink = outputSink(ctx)
	}
	return d.rt.Execs().Start(ctx, p.spec, opts)
}

// execRef names a live exec.
type execRef struct {
	ExecID string `json:"exec_id"`
}

func (p *execRef) validate() error {
	p.ExecID = strings.TrimSpace(p.ExecID)
	if p.ExecID == "" {
		return boxerr.Validation("exec_id", "exec_id is required")
	}
	return nil
}

type writeStdinParams struct {
	execRef
	Data       *string `json:"data"`
	DataBase64 *string `json:"data_base64"`
	EOF        bool    `json:"eof"`
	bytes      []byte
}

func (p *writeStdinParams) validate() error {
	if err := p.execRef.validate(); err != nil {
		return err
	}
	switch {
	case p.Data != nil && p.DataBase64 != nil:
		return boxerr.Validation("data", "give data or data_base64, not both")
	case p.Data != nil:
		p.bytes = []byte(*p.Data)
	case p.DataBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*p.DataBase64)
		if err != nil {
			return boxerr.Validation("data_base64", "data_base64 is not valid base64: %v", err).Wrap(err)
		}
		p.bytes = b
	case !p.EOF:
		return boxerr.Validation("data", "give data, data_base64 or eof")
	}
	return nil
}

type written struct {
	Written int  `json:"written"`
	EOF     bool `json:"eof"`
}

func (d *Dispatcher) writeStdin(ctx context.Context, p writeStdinParams) (written, error) {
	if err := d.rt.Execs().WriteStdin(ctx, p.ExecID, p.bytes, p.EOF); err != nil {
		return written{}, err
	}
	return written{Written: len(p.bytes), EOF: p.EOF}, nil
}

type waitParams struct {
	execRef
	TimeoutSec float64 `json:"timeout_sec"`
}

func (p *waitParams) validate() error {
	if err := p.execRef.validate(); err != nil {
		return err
	}
	if p.TimeoutSec < 0 || p.TimeoutSec > runtime.MaxTimeoutSec {
		return boxerr.Validation("timeout_sec", "timeout_sec must be between 0 and %d, got %v", runtime.MaxTimeoutSec, p.TimeoutSec)
	}
	return nil
}

// waitExec waits for an exec's result; with timeout_sec it answers status
// running and the output so far when the time is up first.
func (d *Dispatcher) waitExec(ctx context.Context, p waitParams) (runtime.ExecResult, error) {
	return d.rt.Execs().Wait(ctx, p.ExecID, time.Duration(p.TimeoutSec*float64(time.Second)))
}

type killParams struct {
	execRef
	Signal string `json:"signal"`
	sig    syscall.Signal
}

// killSignals are the signals box_exec_kill takes, by name.
var killSignals = map[string]syscall.Signal{
	"KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP,
	"QUIT": syscall.SIGQUIT, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
}

func (p *killParams) validate() error {
	if err := p.execRef.validate(); err != nil {
		return err
	}
	name := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(p.Signal)), "SIG")
	if name == "" {
		name = "KILL"
	}
	sig, ok := killSignals[name]
	if !ok {
		return boxerr.Validation("signal", "signal must be one of KILL, TERM, INT, HUP, QUIT, USR1, USR2, got %q", p.Signal)
	}
	p.sig = sig
	return nil
}

func (d *Dispatcher) killExec(ctx context.Context, p killParams) (runtime.ExecInfo, error) {
	return d.rt.Execs().Kill(ctx, p.ExecID, p.sig)
}

type execList struct {
	Execs []runtime.ExecInfo `json:"execs"`
}

func (d *Dispatcher) listExecs(ctx context.Context, p sessionRef) (execList, error) {
	execs, err := d.rt.Execs().List(ctx, p.SessionID)
	return execList{Execs: execs}, err
}

type attachParams struct {
	execRef
	FromSeq int64 `json:"from_seq"`
}

// attachExec streams an exec's output to this connection: the replay
// buffer from from_seq first, then live.
func (d *Dispatcher) attachExec(ctx context.Context, p attachParams) (runtime.Attached, error) {
	return d.rt.Execs().Attach(ctx, p.ExecID, p.FromSeq, outputSink(ctx))
}

type resizeParams struct {
	execRef
	backends.TTYSize
}

func (p *resizeParams) validate() error {
	if err := p.execRef.validate(); err != nil {
		return err
	}
	return validTTY("", p.TTYSize)
}

func (d *Dispatcher) resizeExec(ctx context.Context, p resizeParams) (struct{}, error) {
	return struct{}{}, d.rt.Execs().Resize(ctx, p.ExecID, p.TTYSize)
}
