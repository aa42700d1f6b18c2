package actions

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/skills"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// Storage scopes of the reference's storage analysis.
const (
	scopeRuntimeHost     = "runtime_host"
	scopeSandboxSessions = "sandbox_sessions"
)

type storageDir struct {
	Key        string `json:"key"`
	Path       string `json:"path"`
	Kind       string `json:"kind"`
	ParentKey  string `json:"parent_key,omitempty"`
	Exists     bool   `json:"exists"`
	SizeBytes  int64  `json:"size_bytes"`
	FileCount  int64  `json:"file_count"`
	ErrorCount int64  `json:"error_count,omitempty"`
	Scope      string `json:"scope"`
}

type storageAnalysis struct {
	SizeBytes        int64        `json:"size_bytes"`
	Directories      []storageDir `json:"directories"`
	ActiveSessions   int          `json:"active_sessions"`
	ManagedProcesses int          `json:"managed_processes"`
}

// storageProbeTimeoutSec bounds the probe run in each session.
const storageProbeTimeoutSec = 15

// storageProbe prints "<size KiB> <entries>" for the session's workspace,
// ~/.cache and /tmp, or "- -" for one that does not exist.
const storageProbe = `for d in "$BOXRT_PROBE_WORKSPACE" /root/.cache /tmp; do
if [ -d "$d" ]; then k=$(du -sk "$d" 2>/dev/null | cut -f1); n=$(find "$d" 2>/dev/null | wc -l); echo "${k:-0} ${n:-0}"; else echo "- -"; fi
done`

// storageAnalysis: box_get_storage_analysis {} → the calling Workspace's
// storage, with the reference's keys: its directory on the runtime host
// (workspace and its mcp/inbox/outbox), its own skill store, and inside each
// of its sessions the workspace, ~/.cache and /tmp (measured by a probe run
// in the session; a session whose probe fails counts in error_count).
func (t *Tenancy) storageAnalysis(ctx context.Context, _ none) (storageAnalysis, error) {
	p, ok := tenant.FromContext(ctx)
	if !ok {
		return storageAnalysis{}, errNoContext()
	}
	cfg := t.rt.Config()
	wsDir := filepath.Join(cfg.DefaultWorkspace(), "tenants", p.Namespace())
	out := storageAnalysis{Directories: []storageDir{}}
	root := hostDir("workspace", wsDir, "root", "")
	out.Directories = append(out.Directories, root)
	for _, sub := range []string{"mcp", "inbox", "outbox"} {
		out.Directories = append(out.Directories, hostDir(sub, filepath.Join(wsDir, sub), "detail", "workspace"))
	}
	skillRoot := hostDir("skills", skills.ScopedRoot(cfg.SkillStoreRoot(), p.Namespace()), "root", "")
	out.Directories = append(out.Directories, skillRoot)
	out.SizeBytes = root.SizeBytes + skillRoot.SizeBytes

	sessions := []storageDir{
		{Key: "session_workspaces", Path: "/workspace", Kind: "root", Scope: scopeSandboxSessions},
		{Key: "session_caches", Path: "/root/.cache", Kind: "root", Scope: scopeSandboxSessions},
		{Key: "session_temp", Path: "/tmp", Kind: "root", Scope: scopeSandboxSessions},
	}
	procs := storageDir{Key: "managed_process_workspaces", Path: "/workspace", Kind: "detail", ParentKey: "session_workspaces", Scope: scopeSandboxSessions}
	for _, s := range t.rt.ListSessions(ctx) {
		out.ActiveSessions++
		running := 0
		if d, err := t.rt.GetSession(ctx, p.LogicalID(s.SessionID)); err == nil {
			for _, pi := range d.ManagedProcesses {
				if pi.Status == "running" {
					running++
				}
			}
		}
		out.ManagedProcesses += running
		sizes, err := t.probeSession(ctx, s)
		for i := range sessions {
			if err != nil {
				sessions[i].ErrorCount++
				continue
			}
			if sizes[i].exists {
				sessions[i].Exists = true
				sessions[i].SizeBytes += sizes[i].bytes
				sessions[i].FileCount += sizes[i].files
			}
		}
		if running > 0 && err == nil && sizes[0].exists {
			procs.Exists = true
			procs.SizeBytes += sizes[0].bytes
			procs.FileCount += sizes[0].files
		}
	}
	for _, d := range sessions {
		out.SizeBytes += d.SizeBytes
	}
	out.Directories = append(append(out.Directories, sessions...), procs)
	return out, nil
}

type probedDir struct {
	exists       bool
	bytes, files int64
}

// probeSession measures one session from inside it, with the session's
// own sandbox settings so the exec reuses it. The exec names it as the
// caller does, by its logical id (the list answers physical ones).
func (t *Tenancy) probeSession(ctx context.Context, s runtime.SessionInfo) ([3]probedDir, error) {
	var out [3]probedDir
	spec := runtime.DefaultSpec()
	spec.SessionID, spec.Sandbox = tenant.Logical(ctx, s.SessionID), s.Sandbox
	spec.Cmd, spec.TimeoutSec = storageProbe, storageProbeTimeoutSec
	spec.Env = map[string]string{"BOXRT_PROBE_WORKSPACE": s.MountPath}
	if err := spec.Normalize(); err != nil {
		return out, err
	}
	res, err := t.rt.Execs().Exec(ctx, spec)
	if err != nil {
		return out, err
	}
	if res.Status != "completed" || res.ExitCode == nil || *res.ExitCode != 0 {
		return out, boxerr.Failure("storage probe in %s did not complete", s.SessionID)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != len(out) {
		return out, boxerr.Failure("storage probe in %s printed %d lines", s.SessionID, len(lines))
	}
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) != 2 || f[0] == "-" {
			continue
		}
		kib, err1 := strconv.ParseInt(f[0], 10, 64)
		n, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return out, boxerr.Failure("storage probe in %s printed %q", s.SessionID, l)
		}
		out[i] = probedDir{exists: true, bytes: kib * 1024, files: n}
	}
	return out, nil
}

// hostDir measures a directory on the runtime host without following
// symlinks.
func hostDir(key, path, kind, parent string) storageDir {
	d := storageDir{Key: key, Path: path, Kind: kind, ParentKey: parent, Scope: scopeRuntimeHost}
	fi, err := os.Lstat(path)
	if err != nil || !fi.IsDir() {
		return d
	}
	d.Exists = true
	_ = filepath.WalkDir(path, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			d.ErrorCount++
			return nil
		}
		if e.Type().IsRegular() {
			if info, err := e.Info(); err == nil {
				d.SizeBytes += info.Size()
				d.FileCount++
			} else {
				d.ErrorCount++
			}
		}
		return nil
	})
	return d
}
