package server

import (
	"encoding/json"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/internal/clip"
	"github.com/boxrt/boxrt/rpc"
)

// logCall logs one answered request: method, id, session and process ids,
// duration, time queued, error type. Params are never logged, only those two ids. The
// heartbeat logs at debug so it does not drown the rest.
func logCall(log zerolog.Logger, call rpc.Call) {
	var ev *zerolog.Event
	switch {
	case call.Err != nil:
		ev = log.Info().Str("error_type", call.Err.Type).Str("error", clip.String(call.Err.Message, 300))
	case call.Method == "__ping":
		ev = log.Debug() // decided before an Info event is built: this runs for every heartbeat
	default:
		ev = log.Info()
	}
	if !ev.Enabled() {
		return
	}
	if ids := callIDs(call.Params); ids.SessionID != "" {
		ev = ev.Str("session_id", ids.SessionID)
		if ids.ProcessID != "" {
			ev = ev.Str("process_id", ids.ProcessID)
		}
	}
	if call.Waited > 0 {
		ev = ev.Float64("queued_ms", float64(call.Waited.Microseconds())/1000)
	}
	ev.Str("method", call.Method).RawJSON("request_id", call.ID).Str("transport", call.Transport).
		Float64("duration_ms", float64(call.Duration.Microseconds())/1000).Msg("rpc")
}

type callIdentifiers struct {
	SessionID string `json:"session_id"`
	ProcessID string `json:"process_id"`
	Spec      struct {
		ProcessID string `json:"process_id"`
	} `json:"spec"`
}

// callIDs reads the session and process ids of a request for its log line;
// large params (zip uploads) are not decoded again.
func callIDs(params json.RawMessage) callIdentifiers {
	var ids callIdentifiers
	if len(params) == 0 || len(params) > 64<<10 || json.Unmarshal(params, &ids) != nil {
		return callIdentifiers{}
	}
	if ids.ProcessID == "" {
		ids.ProcessID = ids.Spec.ProcessID
	}
	return ids
}
