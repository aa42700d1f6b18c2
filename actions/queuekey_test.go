package actions

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/boxrt/boxrt/rpc"
)

func TestQueueKey(t *testing.T) {
	for _, tc := range []struct {
		name, params string
		meta         *rpc.Meta
		want         string
	}{
		{name: "session", params: `{"session_id":"s1","cmd":"true"}`, want: "s1"},
		{name: "after other members", params: ` { "cmd" : "a\"}," , "env":{"session_id":"x"}, "n": [1,{"a":"]"}], "t": true, "session_id" : "s2" }`, want: "s2"},
		{name: "escaped", params: `{"session_id":"s\u00e9\"q"}`, want: "sé\"q"},
		{name: "nested only", params: `{"spec":{"session_id":"x"}}`},
		{name: "not a string", params: `{"session_id":7}`},
		{name: "none", params: `{}`},
		{name: "not an object", params: `[1]`},
		{name: "truncated", params: `{"cmd":"x`},
		{name: "within the workspace", params: `{"session_id":"global"}`, meta: &rpc.Meta{InstanceUUID: "i", WorkspaceUUID: "w"}, want: "i\x00w\x00global"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, QueueKey(&rpc.Request{Params: json.RawMessage(tc.params), Meta: tc.meta}))
		})
	}
}
