package actions

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/boxrt/boxrt/internal/clip"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/skills"
)

// Server is what the actions need from the process around them.
type Server struct {
	Version string
	// RelayURL returns the relay's base URL ("" when no listener runs).
	RelayURL func() string
	// RelayToken is returned over stdio only, when boxrt generated it.
	RelayToken string
}

// Dispatcher routes requests to methods. It implements rpc.Handler.
type Dispatcher struct {
	rt      *runtime.Runtime
	skills  *skills.Store
	server  Server
	methods map[string]handler
	errors  errorRing
	watches WatchBudget
	subs    subscriptions
}

// New returns a Dispatcher with every method registered: the runtime's and
// the skill store's.
func New(rt *runtime.Runtime, store *skills.Store, server Server) *Dispatcher {
	d := &Dispatcher{rt: rt, skills: store, server: server}
	d.methods = map[string]handler{
		"__ping":               method(d.ping),
		"box_init":             method(d.init),
		"box_health":           method(d.health),
		"box_status":           method(d.status),
		"box_get_backend_info": method(d.backendInfo),
		"box_shutdown":         method(d.shutdown),
		"box_exec":             method(d.exec),
		"box_exec_start":       method(d.startExec),
		"box_exec_write_stdin": method(d.writeStdin),
		"box_exec_wait":        method(d.waitExec),
		"box_exec_kill":        method(d.killExec),
		"box_exec_list":        method(d.listExecs),
		"box_exec_attach":      method(d.attachExec),
		"box_exec_resize":      method(d.resizeExec),
		"box_create_session":   method(d.createSession),
		"box_get_session":      method(d.getSession),
		"box_get_sessions":     method(d.getSessions),
		"box_delete_session":   method(d.deleteSession),
		"box_suspend_session":  method(d.suspendSession),
		"box_resume_session":   method(d.resumeSession),
		"box_fork_session":     method(d.forkSession),
		"box_snapshot_session": method(d.snapshotSession),
		"box_update_network":   method(d.updateNetwork),
		"box_list_snapshots":   method(d.listSnapshots),
		"box_get_snapshot":     method(d.getSnapshot),
		"box_delete_snapshot":  method(d.deleteSnapshot),

		"box_start_managed_process": method(d.startProcess),
		"box_get_managed_process":   method(d.getProcess),
		"box_stop_managed_process":  method(d.stopProcess),

		"box_list_skills":          method(d.listSkills),
		"box_get_skill":            method(d.getSkill),
		"box_create_skill":         method(d.createSkill),
		"box_update_skill":         method(d.updateSkill),
		"box_delete_skill":         method(d.deleteSkill),
		"box_scan_skill_directory": method(d.scanSkillDirectory),
		"box_list_skill_files":     method(d.listSkillFiles),
		"box_read_skill_file":      method(d.readSkillFile),
		"box_write_skill_file":     method(d.writeSkillFile),
		"box_preview_skill_zip":    method(d.previewSkillZip),
		"box_install_skill_zip":    method(d.installSkillZip),
		"__file_chunk":             method(d.fileChunk),

		"box_fs_read":    method(d.fsRead),
		"box_fs_write":   method(d.fsWrite),
		"box_fs_list":    method(d.fsList),
		"box_fs_stat":    method(d.fsStat),
		"box_fs_remove":  method(d.fsRemove),
		"box_fs_mkdir":   method(d.fsMkdir),
		"box_fs_rename":  method(d.fsRename),
		"box_fs_watch":   method(d.fsWatch),
		"box_fs_unwatch": method(d.fsUnwatch),

		"box_expose_port":         method(d.exposePort),
		"box_unexpose_port":       method(d.unexposePort),
		"box_subscribe_events":    method(d.subscribeEvents),
		"box_unsubscribe_events":  method(d.unsubscribeEvents),
		"box_get_session_metrics": method(d.sessionMetrics),
	}
	return d
}

// Methods lists the registered method names.
func (d *Dispatcher) Methods() []string {
	out := make([]string, 0, len(d.methods))
	for name := range d.methods {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Handle implements rpc.Handler. Failures are also kept in the ring of
// recent errors box_status reports.
func (d *Dispatcher) Handle(ctx context.Context, req *rpc.Request) (json.RawMessage, error) {
	res, err := d.call(ctx, req)
	return res, d.record(req, err)
}

// call runs the method req names.
func (d *Dispatcher) call(ctx context.Context, req *rpc.Request) (json.RawMessage, error) {
	if m, ok := d.methods[req.Method]; ok {
		return m(ctx, req.Params)
	}
	return nil, &rpc.MethodNotFoundError{Method: req.Method}
}

// record keeps a failure in the ring of recent errors and returns it; nil
// stays nil.
func (d *Dispatcher) record(req *rpc.Request, err error) error {
	if err != nil {
		e := rpc.Encode(EncodeError, err)
		d.errors.add(RecentError{Time: time.Now().UTC(), Method: req.Method, Type: e.Type, Code: e.Code,
			Message: clip.String(e.Message, 500), SessionID: sessionIDOf(req.Params)})
	}
	return err
}

// Watches is the directory watches' shared budget, for the other APIs
// that watch (E2B's WatchDir).
func (d *Dispatcher) Watches() *WatchBudget { return &d.watches }
