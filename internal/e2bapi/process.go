package e2bapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process"
	"github.com/boxrt/boxrt/runtime"
)

// keepaliveEvery is how often a quiet command stream carries a keepalive
// event, so proxies and the SDK's idle timers see it alive.
const keepaliveEvery = 30 * time.Second

// commandTimeout is the runtime timeout of a command: the Start call's
// deadline (the SDK's timeoutMs, sent as Connect-Timeout-Ms), after which
// E2B's envd ends the command too; without one, the runtime's longest.
func commandTimeout(ctx context.Context) int {
	d, ok := ctx.Deadline()
	if !ok {
		return runtime.MaxTimeoutSec
	}
	return min(max(1, int(math.Ceil(time.Until(d).Seconds()))), runtime.MaxTimeoutSec)
}

// processService is envd's process.Process over the runtime's live execs.
type processService struct{ h *Handler }

// shellWord quotes s for sh.
func shellWord(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// execLine is the command line that runs cfg's program in the shell the
// backend starts each exec in. The shell execs the program, as E2B's envd
// does after its own wrapper: without exec, sh forks it (dash does so even
// for the last command of -c) and waits, which costs a fork and a second
// process per command (about a millisecond a command on bwrap), and the
// program is found on PATH rather than as a shell builtin, as envd's
// exec.Command finds it.
func execLine(cfg *process.ProcessConfig) string {
	var b strings.Builder
	b.WriteString("exec ")
	b.WriteString(shellWord(cfg.GetCmd()))
	for _, a := range cfg.GetArgs() {
		b.WriteByte(' ')
		b.WriteString(shellWord(a))
	}
	return b.String()
}

// execSpec is the exec of a ProcessConfig in sb: cmd and args quoted into
// one command line, the sandbox's envs under the command's.
func execSpec(ctx context.Context, sb *sandbox, cfg *process.ProcessConfig) (runtime.Spec, error) {
	if cfg.GetCmd() == "" {
		return runtime.Spec{}, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd must not be empty"))
	}
	spec := runtime.DefaultSpec()
	spec.SessionID = sb.logical
	spec.Sandbox = sb.sandboxSpec()
	spec.Cmd = execLine(cfg)
	spec.NoLogin = true
	spec.TimeoutSec = commandTimeout(ctx)
	spec.Env = maps.Clone(sb.envs)
	if spec.Env == nil {
		spec.Env = map[string]string{}
	}
	maps.Copy(spec.Env, cfg.GetEnvs())
	if _, set := spec.Env["HOME"]; !set && spec.MountPathOrDefault() == userHome {
		spec.Env["HOME"] = userHome
	}
	if cfg.Cwd != nil {
		spec.Workdir = cfg.GetCwd()
	}
	return spec, spec.Normalize()
}

// maxTTYCells bounds a terminal's rows and columns, as box_exec does.
const maxTTYCells = 1000

func ttyOf(p *process.PTY) (*backends.TTYSize, error) {
	if p == nil {
		return nil, nil
	}
	rows, cols := p.GetSize().GetRows(), p.GetSize().GetCols()
	if rows < 1 || rows > maxTTYCells || cols < 1 || cols > maxTTYCells {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty.size rows and cols must be between 1 and %d, got %dx%d", maxTTYCells, rows, cols))
	}
	return &backends.TTYSize{Rows: uint16(rows), Cols: uint16(cols)}, nil
}

// chunkSink hands an exec's chunks to the stream's goroutine; it gives up
// when the stream's request ends.
func chunkSink(ctx context.Context, ch chan<- runtime.ExecChunk) runtime.ChunkSink {
	return func(c runtime.ExecChunk) error {
		c.Data = append([]byte(nil), c.Data...)
		select {
		case ch <- c:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	sb := sandboxOf(ctx)
	spec, err := execSpec(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return connectError(err)
	}
	tty, err := ttyOf(req.Msg.Pty)
	if err != nil {
		return err
	}
	chunks := make(chan runtime.ExecChunk, 16)
	opts := runtime.ExecOptions{Stdin: req.Msg.Stdin == nil || req.Msg.GetStdin() || tty != nil, PTY: tty, Sink: chunkSink(ctx, chunks)}
	info, err := p.h.rt.Execs().Start(ctx, spec, opts)
	if err != nil {
		return connectError(err)
	}
	pid := sb.addCommand(info.ExecID, req.Msg.GetProcess(), req.Msg.GetTag())
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	return p.follow(ctx, info.ExecID, pid, tty != nil, chunks, send)
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	sb := sandboxOf(ctx)
	pid, c, err := findCommand(sb, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	// Output already sent to the starter is not replayed: a connecting
	// client sees what comes next, as envd does.
	next := int64(0)
	if infos, err := p.h.rt.Execs().List(ctx, sb.logical); err == nil {
		for _, i := range infos {
			if i.ExecID == c.execID {
				next = i.NextSeq
			}
		}
	}
	chunks := make(chan runtime.ExecChunk, 16)
	att, err := p.h.rt.Execs().Attach(ctx, c.execID, next, chunkSink(ctx, chunks))
	if err != nil {
		return connectError(err)
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	return p.follow(ctx, c.execID, pid, att.PTY, chunks, send)
}

// follow streams a command: its start event, its output as it comes, a
// keepalive when quiet, and its end.
func (p *processService) follow(ctx context.Context, execID string, pid uint32, pty bool, chunks <-chan runtime.ExecChunk, send func(*process.ProcessEvent) error) error {
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	tick := time.NewTicker(keepaliveEvery)
	defer tick.Stop()
	for {
		var ev *process.ProcessEvent
		select {
		case c := <-chunks:
			if c.EOF {
				return p.end(ctx, execID, send)
			}
			ev = &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: dataEvent(c, pty)}}
		case <-tick.C:
			ev = &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := send(ev); err != nil {
			return err
		}
	}
}

func dataEvent(c runtime.ExecChunk, pty bool) *process.ProcessEvent_DataEvent {
	switch {
	case pty:
		return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: c.Data}}
	case c.Stream == "stderr":
		return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: c.Data}}
	}
	return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: c.Data}}
}

// end sends the end event of an exec whose output is complete.
func (p *processService) end(ctx context.Context, execID string, send func(*process.ProcessEvent) error) error {
	res, err := p.h.rt.Execs().Wait(ctx, execID, 0)
	end := &process.ProcessEvent_EndEvent{ExitCode: -1, Status: res.Status}
	switch {
	case err != nil:
		msg := err.Error()
		end.Error, end.Status = &msg, "error"
	case res.ExitCode != nil:
		end.ExitCode, end.Exited = int32(*res.ExitCode), true
		end.Status = fmt.Sprintf("exit status %d", *res.ExitCode)
	default:
		msg := "command ended without an exit code: " + res.Status
		end.Error = &msg
	}
	return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
}

func findCommand(sb *sandbox, sel *process.ProcessSelector) (uint32, *command, error) {
	pid, c, ok := sb.lookup(sel)
	if !ok {
		return 0, nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s not found", describeSelector(sel)))
	}
	return pid, c, nil
}

func describeSelector(sel *process.ProcessSelector) string {
	if t, ok := sel.GetSelector().(*process.ProcessSelector_Tag); ok {
		return fmt.Sprintf("with tag %q", t.Tag)
	}
	return fmt.Sprintf("with pid %d", sel.GetPid())
}

func (p *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	sb := sandboxOf(ctx)
	infos, err := p.h.rt.Execs().List(ctx, sb.logical)
	if err != nil {
		return nil, connectError(err)
	}
	running := map[string]bool{}
	for _, i := range infos {
		running[i.ExecID] = i.Status == runtime.StatusRunning
	}
	out := &process.ListResponse{}
	for pid, c := range sb.commands() {
		if running[c.execID] {
			info := &process.ProcessInfo{Config: c.config, Pid: pid}
			if c.tag != "" {
				info.Tag = &c.tag
			}
			out.Processes = append(out.Processes, info)
		}
	}
	return connect.NewResponse(out), nil
}

// input writes to the stdin (or terminal) of the selected command.
func (p *processService) input(ctx context.Context, sel *process.ProcessSelector, in *process.ProcessInput, eof bool) error {
	_, c, err := findCommand(sandboxOf(ctx), sel)
	if err != nil {
		return err
	}
	var data []byte
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = v.Stdin
	case *process.ProcessInput_Pty:
		data = v.Pty
	}
	return connectError(p.h.rt.Execs().WriteStdin(ctx, c.execID, data, eof))
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	if err := p.input(ctx, req.Msg.GetProcess(), req.Msg.GetInput(), false); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	if err := p.input(ctx, req.Msg.GetProcess(), nil, true); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var sel *process.ProcessSelector
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
		case *process.StreamInputRequest_Data:
			if sel == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the input stream must start with a start event naming the process"))
			}
			if err := p.input(ctx, sel, ev.Data.GetInput(), false); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	_, c, err := findCommand(sandboxOf(ctx), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal must be SIGKILL (9) or SIGTERM (15), got %d", req.Msg.GetSignal()))
	}
	if _, err := p.h.rt.Execs().Kill(ctx, c.execID, sig); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	_, c, err := findCommand(sandboxOf(ctx), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	tty, err := ttyOf(req.Msg.Pty)
	if err != nil {
		return nil, err
	}
	if tty != nil {
		if err := p.h.rt.Execs().Resize(ctx, c.execID, *tty); err != nil {
			return nil, connectError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
