package reconnect

import (
	"context"
	"time"
)

// SessionInfo is a session as boxrt describes it (box_create_session,
// box_get_session, box_get_sessions; docs/protocol.md's SessionInfo).
type SessionInfo struct {
	SessionID        string  `json:"session_id"`
	BackendName      string  `json:"backend_name"`
	BackendSessionID string  `json:"backend_session_id"`
	Image            string  `json:"image"`
	Network          string  `json:"network"`
	HostPathMode     string  `json:"host_path_mode"`
	MountPath        string  `json:"mount_path"`
	Persistent       bool    `json:"persistent"`
	CPUs             float64 `json:"cpus"`
	MemoryMB         int     `json:"memory_mb"`
	PidsLimit        int     `json:"pids_limit"`
	ReadOnlyRootfs   bool    `json:"read_only_rootfs"`
	WorkspaceQuotaMB int     `json:"workspace_quota_mb"`
	Isolation        string  `json:"isolation"`
	// HostPath is the resolved host directory, nil when none.
	HostPath    *string   `json:"host_path"`
	ExtraMounts []Mount   `json:"extra_mounts"`
	CreatedAt   time.Time `json:"created_at"`
	LastUsedAt  time.Time `json:"last_used_at"`
	// State is running, suspended or lost (the sandbox was found gone).
	State string `json:"state"`
	// Restarted: the session's sandbox was restarted since the session was
	// made or resumed (processes lost, files kept).
	Restarted bool `json:"restarted,omitempty"`

	// SessionCreated (box_create_session only) says this call created the
	// session.
	SessionCreated bool `json:"session_created"`
	// ManagedProcesses (box_get_session only) are the session's managed
	// processes by process id; ManagedProcess is the one named "default".
	ManagedProcesses map[string]ProcessInfo `json:"managed_processes"`
	ManagedProcess   *ProcessInfo           `json:"managed_process"`
}

// CreateSession gets or creates session spec.SessionID without running
// anything (box_create_session; spec.Cmd is ignored).
func (c *Client) CreateSession(ctx context.Context, spec ExecSpec) (SessionInfo, error) {
	var r SessionInfo
	err := c.Call(ctx, "box_create_session", spec, &r)
	return r, err
}

// GetSession describes a session (box_get_session); an unknown one is
// ErrSessionNotFound.
func (c *Client) GetSession(ctx context.Context, sessionID string) (SessionInfo, error) {
	var r SessionInfo
	err := c.Call(ctx, "box_get_session", map[string]any{"session_id": sessionID}, &r)
	return r, err
}

// ListSessions lists the runtime's sessions, oldest first
// (box_get_sessions).
func (c *Client) ListSessions(ctx context.Context) ([]SessionInfo, error) {
	var r struct {
		Sessions []SessionInfo `json:"sessions"`
	}
	err := c.Call(ctx, "box_get_sessions", struct{}{}, &r)
	return r.Sessions, err
}

// DeleteSession kills the session's running exec, stops its managed
// processes and removes its sandbox (box_delete_session).
func (c *Client) DeleteSession(ctx context.Context, sessionID string) error {
	return c.Call(ctx, "box_delete_session", map[string]any{"session_id": sessionID}, nil)
}
