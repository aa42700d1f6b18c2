package reconnect

import (
	"context"
	"encoding/base64"
	"time"
	"unicode/utf8"
)

// Typed calls for commands: box_exec and the live execs (box_exec_start,
// _wait, _kill, _write_stdin, _list). Their types mirror docs/protocol.md's
// wire objects field for field; streaming output and terminals stay with
// CallStream.

// ExecSpec is docs/protocol.md's Spec: the params of box_exec,
// box_exec_start and box_create_session (which ignores Cmd). Zero fields
// are left out, so boxrt's defaults apply; ReadOnlyRootfs is a pointer
// because its default is true.
type ExecSpec struct {
	SessionID        string            `json:"session_id"`
	Cmd              string            `json:"cmd,omitempty"`
	Workdir          string            `json:"workdir,omitempty"`
	TimeoutSec       int               `json:"timeout_sec,omitempty"`
	Network          string            `json:"network,omitempty"`
	Env              map[string]string `json:"env,omitempty"`
	Image            string            `json:"image,omitempty"`
	HostPath         string            `json:"host_path,omitempty"`
	HostPathMode     string            `json:"host_path_mode,omitempty"`
	MountPath        string            `json:"mount_path,omitempty"`
	ExtraMounts      []Mount           `json:"extra_mounts,omitempty"`
	Persistent       bool              `json:"persistent,omitempty"`
	CPUs             float64           `json:"cpus,omitempty"`
	MemoryMB         int               `json:"memory_mb,omitempty"`
	PidsLimit        int               `json:"pids_limit,omitempty"`
	ReadOnlyRootfs   *bool             `json:"read_only_rootfs,omitempty"`
	WorkspaceQuotaMB int               `json:"workspace_quota_mb,omitempty"`
	Isolation        string            `json:"isolation,omitempty"`
	SkillName        string            `json:"skill_name,omitempty"`
	Skills           []SkillMount      `json:"skills,omitempty"`
	MaxOutputBytes   int               `json:"max_output_bytes,omitempty"`
	FromSnapshot     string            `json:"from_snapshot,omitempty"`
}

// Mount is an item of extra_mounts: Mode is "rw" (default), "ro" or "none".
type Mount struct {
	HostPath  string `json:"host_path"`
	MountPath string `json:"mount_path"`
	Mode      string `json:"mode,omitempty"`
}

// SkillMount is an item of skills: Mode is "ro" (default) or "rw".
type SkillMount struct {
	Name string `json:"name"`
	Mode string `json:"mode,omitempty"`
}

// ExecResult is a command's outcome (box_exec, box_exec_wait).
type ExecResult struct {
	SessionID   string `json:"session_id"`
	BackendName string `json:"backend_name"`
	// Status is completed or timed_out; for live execs also canceled and,
	// from WaitExec with a timeout, running.
	Status string `json:"status"`
	// ExitCode is nil exactly when Status is not completed.
	ExitCode        *int   `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	DurationMS      int64  `json:"duration_ms"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	SessionCreated  bool   `json:"session_created"`
	// Restarted: the session's sandbox was started afresh for or during
	// this command; processes earlier commands left running are gone.
	Restarted bool `json:"restarted"`
}

// ExecInfo describes a live exec (box_exec_start, _kill, _list).
type ExecInfo struct {
	ExecID    string `json:"exec_id"`
	SessionID string `json:"session_id"`
	Cmd       string `json:"cmd"`
	// Status is running, then the result's status, or failed.
	Status         string     `json:"status"`
	Background     bool       `json:"background"`
	PTY            bool       `json:"pty"`
	Stdin          bool       `json:"stdin"`
	StartedAt      time.Time  `json:"started_at"`
	EndedAt        *time.Time `json:"ended_at"`
	ExitCode       *int       `json:"exit_code"`
	NextSeq        int64      `json:"next_seq"`
	SessionCreated bool       `json:"session_created"`
}

// Exec runs spec.Cmd in session spec.SessionID, creating the session on
// first use (box_exec), and returns once the command has ended.
func (c *Client) Exec(ctx context.Context, spec ExecSpec) (ExecResult, error) {
	var r ExecResult
	err := c.Call(ctx, "box_exec", spec, &r)
	return r, err
}

// ExecStream is Exec with the command's output handed to onOutput as it
// arrives (box_exec with "stream": true): its stdout and stderr chunks, in
// order, all before ExecStream returns. onOutput runs on the link's
// reading goroutine and must not block. A lost link fails the call, as
// for Exec.
func (c *Client) ExecStream(ctx context.Context, spec ExecSpec, onOutput func(ExecOutput)) (ExecResult, error) {
	params := struct {
		ExecSpec
		Stream bool `json:"stream"`
	}{spec, true}
	var r ExecResult
	err := c.CallStream(ctx, "box_exec", params, &r, func(o ExecOutput) {
		if o.Err == nil && !o.EOF {
			onOutput(o)
		}
	})
	return r, err
}

// StartExec starts spec.Cmd in the background (box_exec_start; the
// timeout defaults to an hour) and returns at once. stdin keeps the
// command's stdin open for WriteStdin.
func (c *Client) StartExec(ctx context.Context, spec ExecSpec, stdin bool) (ExecInfo, error) {
	params := struct {
		ExecSpec
		Stdin bool `json:"stdin,omitempty"`
	}{spec, stdin}
	var r ExecInfo
	err := c.Call(ctx, "box_exec_start", params, &r)
	return r, err
}

// WaitExec waits for a live exec to end (box_exec_wait) and returns its
// result; with timeout > 0, at most that long, after which the result is
// the output so far with status running.
func (c *Client) WaitExec(ctx context.Context, execID string, timeout time.Duration) (ExecResult, error) {
	params := map[string]any{"exec_id": execID}
	if timeout > 0 {
		params["timeout_sec"] = timeout.Seconds()
	}
	var r ExecResult
	err := c.Call(ctx, "box_exec_wait", params, &r)
	return r, err
}

// KillExec signals a live exec's process tree (box_exec_kill; signal ""
// is KILL) and returns its ExecInfo once it has ended.
func (c *Client) KillExec(ctx context.Context, execID, signal string) (ExecInfo, error) {
	params := map[string]any{"exec_id": execID}
	if signal != "" {
		params["signal"] = signal
	}
	var r ExecInfo
	err := c.Call(ctx, "box_exec_kill", params, &r)
	return r, err
}

// WriteStdin writes data to a live exec's stdin, then closes it if eof
// (box_exec_write_stdin), and returns the byte count the command's side
// took. It waits, as a full pipe would, for a command that does not read.
func (c *Client) WriteStdin(ctx context.Context, execID string, data []byte, eof bool) (int, error) {
	params := map[string]any{"exec_id": execID}
	switch {
	case !utf8.Valid(data):
		params["data_base64"] = base64.StdEncoding.EncodeToString(data)
	case len(data) > 0 || !eof:
		params["data"] = string(data)
	}
	if eof {
		params["eof"] = true
	}
	var r struct {
		Written int `json:"written"`
	}
	err := c.Call(ctx, "box_exec_write_stdin", params, &r)
	return r.Written, err
}

// ListExecs lists a session's live execs, running and recently finished,
// oldest first (box_exec_list).
func (c *Client) ListExecs(ctx context.Context, sessionID string) ([]ExecInfo, error) {
	var r struct {
		Execs []ExecInfo `json:"execs"`
	}
	err := c.Call(ctx, "box_exec_list", map[string]any{"session_id": sessionID}, &r)
	return r.Execs, err
}
