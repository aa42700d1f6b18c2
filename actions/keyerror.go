package actions

import (
	"encoding/json"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
)

// requiredKeys are the data keys the reference's server reads with
// data[key] for an action: a request without one is answered with
// Python's KeyError, whose text is the quoted key.
var requiredKeys = map[string][]string{
	"box_get_session":           {"session_id"},
	"box_delete_session":        {"session_id"},
	"box_start_managed_process": {"session_id", "spec"},
	"box_get_managed_process":   {"session_id"},
	"box_stop_managed_process":  {"session_id"},
	"box_get_skill":             {"name"},
}

// missingKey answers `KeyError: '<key>'` for the first required key of
// method absent from params, as the reference does (LangBot mode; boxrt's
// own answer is a BoxValidationError naming the field). Params that are
// not an object are left to the method's decoder.
func missingKey(method string, params json.RawMessage) error {
	keys := requiredKeys[method]
	if len(keys) == 0 {
		return nil
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(params, &members) != nil || members == nil {
		return nil
	}
	for _, k := range keys {
		if _, ok := members[k]; !ok {
			return &rpc.Error{Code: boxerr.ErrValidation.Code, Type: "KeyError", Message: "'" + k + "'"}
		}
	}
	return nil
}
