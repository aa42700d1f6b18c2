package reconnect

import (
	"context"
	"time"
)

// ProcessSpec is a managed process to start (docs/protocol.md's
// ProcessSpec); zero fields take boxrt's defaults (process id "default",
// cwd /workspace).
type ProcessSpec struct {
	ProcessID string            `json:"process_id,omitempty"`
	Command   string            `json:"command"`
	Args      []string          `json:"args,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	MemoryMB  int               `json:"memory_mb,omitempty"`
}

// ProcessInfo describes a managed process (docs/protocol.md's
// ProcessInfo).
type ProcessInfo struct {
	SessionID string   `json:"session_id"`
	ProcessID string   `json:"process_id"`
	Command   string   `json:"command"`
	Args      []string `json:"args"`
	Cwd       string   `json:"cwd"`
	// Status is running or exited.
	Status        string     `json:"status"`
	EnvKeys       []string   `json:"env_keys"`
	Attached      bool       `json:"attached"`
	StartedAt     time.Time  `json:"started_at"`
	ExitedAt      *time.Time `json:"exited_at"`
	ExitCode      *int       `json:"exit_code"`
	StderrPreview string     `json:"stderr_preview"`
	PendingLines  int        `json:"pending_lines"`
	Resumed       bool       `json:"resumed"`
	// RelayToken is the credential for this process's relay only.
	RelayToken string `json:"relay_token"`
}

// StartProcess starts a managed process in an existing session, replacing
// a running one of the same process id (box_start_managed_process).
func (c *Client) StartProcess(ctx context.Context, sessionID string, spec ProcessSpec) (ProcessInfo, error) {
	var r ProcessInfo
	err := c.Call(ctx, "box_start_managed_process", map[string]any{"session_id": sessionID, "spec": spec}, &r)
	return r, err
}

// GetProcess describes a managed process, running or retained after its
// exit (box_get_managed_process; processID "" is "default").
func (c *Client) GetProcess(ctx context.Context, sessionID, processID string) (ProcessInfo, error) {
	var r ProcessInfo
	err := c.Call(ctx, "box_get_managed_process", map[string]any{"session_id": sessionID, "process_id": processID}, &r)
	return r, err
}

// StopProcess stops a managed process (stdin closed, SIGTERM, 5 s,
// SIGKILL) and forgets it (box_stop_managed_process; processID "" is
// "default").
func (c *Client) StopProcess(ctx context.Context, sessionID, processID string) error {
	return c.Call(ctx, "box_stop_managed_process", map[string]any{"session_id": sessionID, "process_id": processID}, nil)
}
