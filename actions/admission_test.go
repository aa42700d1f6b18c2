package actions

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

// The spec actions' params are spec requests: admission finds their spec.
var (
	_ specRequest = (*execParams)(nil)
	_ specRequest = (*startParams)(nil)
	_ specRequest = (*specParams)(nil)
)

const testWorkspace = "/srv/box/tenants/ws-1"

// policyGate is the params half of Tenancy.admit: the checks and the
// forcing it makes on the decoded request, without a runtime.
func policyGate(policy admissionPolicy) gate {
	return func(_ context.Context, d decoded) error {
		if !d.read {
			return nil
		}
		if err := runtimeOwned(d, policy); err != nil {
			return err
		}
		if sr, ok := d.params.(specRequest); ok {
			if err := managedSpec(sr.specOf(), policy, testWorkspace); err != nil {
				return err
			}
			sr.specOf().spec.SessionID = policy.LogicalSessionID
		}
		return nil
	}
}

// admitted runs params through method P's adapter with policyGate and
// returns what the method was called with.
func admitted[P any](t *testing.T, params string) (P, error) {
	t.Helper()
	var got P
	h := method(func(_ context.Context, p P) (struct{}, error) { got = p; return struct{}{}, nil })
	_, err := h(withGate(context.Background(), policyGate(defaultAdmissionPolicy())), json.RawMessage(params))
	return got, err
}

// TestAdmissionTimeout: a timeout left out (or null) is the policy's
// maximum, not the method's default; one sent is kept within (0, max].
func TestAdmissionTimeout(t *testing.T) {
	max := defaultAdmissionPolicy().MaxTimeoutSec
	cases := []struct {
		name    string
		timeout string // the member as sent; "" leaves it out
		want    int
	}{
		{"absent", "", max},
		{"null", `null`, max},
		{"zero", `0`, max},
		{"negative", `-5`, max},
		{"within", `7`, 7},
		{"the method's default, sent", `30`, runtime.DefaultTimeoutSec},
		{"the maximum", `120`, max},
		{"over the maximum", `9999`, max},
	}
	for _, tc := range cases {
		params := `{"session_id":"s","cmd":"true"`
		if tc.timeout != "" {
			params += `,"timeout_sec":` + tc.timeout
		}
		params += "}"
		t.Run(tc.name, func(t *testing.T) {
			ex, err := admitted[execParams](t, params)
			require.NoError(t, err)
			assert.Equal(t, tc.want, ex.spec.TimeoutSec, "box_exec")
			st, err := admitted[startParams](t, params)
			require.NoError(t, err)
			assert.Equal(t, tc.want, st.spec.TimeoutSec, "box_exec_start (default %d)", runtime.DefaultBackgroundTimeoutSec)
			cs, err := admitted[specParams](t, params)
			require.NoError(t, err)
			assert.Equal(t, tc.want, cs.spec.TimeoutSec, "box_create_session")
		})
	}
	t.Run("without admission the method's default stands", func(t *testing.T) {
		var p startParams
		require.NoError(t, decodeParams(json.RawMessage(`{"session_id":"s"}`), &p))
		assert.Equal(t, runtime.DefaultBackgroundTimeoutSec, p.spec.TimeoutSec)
		var be *boxerr.Error
		require.ErrorAs(t, decodeParams(json.RawMessage(`{"session_id":"s","timeout_sec":0}`), &p), &be, "a zero sent is refused")
		assert.Equal(t, "timeout_sec", be.Details["field"])
	})
}

// TestAdmissionErrorOrder: admission refuses before the params' own
// decoding and validation errors are reported, and what it forces is what
// gets validated.
func TestAdmissionErrorOrder(t *testing.T) {
	admission := func(msg string) *boxerr.Error { return boxerr.Admission("%s", msg) }
	network := admission("Managed sandbox network access is disabled")
	cases := []struct {
		name   string
		params string
		want   *boxerr.Error // nil: admitted
		field  string        // a BoxValidationError naming this field
	}{
		{name: "network on beats an unknown member", params: `{"session_id":"s","network":"on","bogus":1}`, want: network},
		{name: "network on beats a wrong type", params: `{"session_id":"s","cpus":"x","network":"on"}`, want: network},
		{name: "network on beats an invalid env", params: `{"session_id":"s","network":"on","env":{"":"x"}}`, want: network},
		{name: "network on beats a bad pty", params: `{"session_id":"s","network":"on","pty":{"rows":0,"cols":1}}`, want: network},
		{name: "keys match as the decoder matches them", params: `{"session_id":"s","NETWORK":"on"}`, want: network},
		{name: "extra mounts", params: `{"session_id":"s","extra_mounts":[{"host_path":"/tmp","mount_path":"/x"}],"bogus":1}`,
			want: admission("Managed sandbox additional host mounts are disabled")},
		{name: "mount path", params: `{"session_id":"s","mount_path":"/data","memory_mb":"x"}`, want: admission("Managed sandbox mount_path is runtime-owned")},
		{name: "empty mount path", params: `{"session_id":"s","mount_path":""}`, want: admission("Managed sandbox mount_path is runtime-owned")},
		{name: "workdir", params: `{"session_id":"s","workdir":"/etc"}`, want: admission("Managed sandbox workdir must stay under /workspace")},
		{name: "host path", params: `{"session_id":"s","host_path":"/etc"}`, want: admission("Managed sandbox host_path is runtime-owned")},
		{name: "the Workspace's own host path", params: `{"session_id":"s","host_path":"` + testWorkspace + `/"}`},
		{name: "a fork", params: `{"session_id":"s","new_session_id":"t"}`, want: admission("Managed sandbox sessions are runtime-owned; a grant permits no other session")},
		{name: "from a snapshot", params: `{"session_id":"s","from_snapshot":"snap"}`, want: admission("Managed sandbox cannot be restored from a snapshot; its spec is runtime-owned")},
		{name: "from a snapshot of the wrong type", params: `{"session_id":"s","from_snapshot":5}`, want: admission("Managed sandbox cannot be restored from a snapshot; its spec is runtime-owned")},
		{name: "an unknown member after admission", params: `{"session_id":"s","bogus":1}`, field: "bogus"},
		{name: "an invalid env after admission", params: `{"session_id":"s","env":{"":"x"}}`, field: "env"},
		{name: "forced members are not validated as sent", params: `{"session_id":"","memory_mb":1,"cpus":99,"network":" off ","image":"x"}`},
		{name: "not an object: the decoder words it", params: `[1]`, field: "params"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := admitted[execParams](t, tc.params)
			switch {
			case tc.want != nil:
				var be *boxerr.Error
				require.ErrorAs(t, err, &be)
				assert.Equal(t, tc.want.Kind, be.Kind)
				assert.Equal(t, tc.want.Msg, be.Msg)
			case tc.field != "":
				var be *boxerr.Error
				require.ErrorAs(t, err, &be)
				assert.Equal(t, boxerr.ErrValidation, be.Kind, "%v", err)
				assert.Equal(t, tc.field, be.Details["field"])
			default:
				require.NoError(t, err)
				p := p.spec
				assert.Equal(t, "global", p.SessionID)
				assert.Equal(t, backends.NetworkOff, p.Network)
				assert.Equal(t, "", p.Image)
				assert.True(t, p.Persistent)
				assert.Equal(t, 512, p.MemoryMB)
				assert.Equal(t, float64(1), p.CPUs)
			}
		})
	}
}

// TestAdmissionNamedSession: the actions that name a session must name
// the canonical one; a member the method does not know is refused by
// admission first.
func TestAdmissionNamedSession(t *testing.T) {
	owned := "Managed sandbox session_id is runtime-owned"
	cases := []struct {
		name   string
		call   func(*testing.T, string) error
		params string
		msg    string // "" admitted; "validation" a BoxValidationError
	}{
		{"the canonical session", refCall, `{"session_id":" global "}`, ""},
		{"another session", refCall, `{"session_id":"other"}`, owned},
		{"a blank session", refCall, `{"session_id":"  "}`, owned},
		{"a session id of the wrong type", refCall, `{"session_id":5}`, owned},
		{"none named: the method's validation", refCall, `{}`, "validation"},
		{"an unknown member", refCall, `{"session_id":"global","bogus":1}`, "validation"},
		{"from_snapshot is unknown here, refused first", refCall, `{"session_id":"global","from_snapshot":"s"}`,
			"Managed sandbox cannot be restored from a snapshot; its spec is runtime-owned"},
		{"a fork", forkCall, `{"session_id":"global","new_session_id":"b"}`, "Managed sandbox sessions are runtime-owned; a grant permits no other session"},
		{"a fork of another session", forkCall, `{"session_id":"a","new_session_id":"b"}`, "Managed sandbox sessions are runtime-owned; a grant permits no other session"},
		{"a new session id on another method", refCall, `{"session_id":"global","new_session_id":"b"}`, "Managed sandbox sessions are runtime-owned; a grant permits no other session"},
		{"an embedded session id", snapshotCall, `{"session_id":"other"}`, owned},
		{"a file's session id", fileCall, `{"session_id":"other","path":"/x"}`, owned},
		{"a file of the canonical session", fileCall, `{"session_id":"global","path":"/x"}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(t, tc.params)
			var be *boxerr.Error
			switch tc.msg {
			case "":
				require.NoError(t, err)
			case "validation":
				require.ErrorAs(t, err, &be)
				assert.Equal(t, boxerr.ErrValidation, be.Kind, "%v", err)
			default:
				require.ErrorAs(t, err, &be)
				assert.Equal(t, boxerr.ErrAdmission, be.Kind, "%v", err)
				assert.Equal(t, tc.msg, be.Msg)
			}
		})
	}
}

func refCall(t *testing.T, params string) error {
	_, err := admitted[sessionRef](t, params)
	return err
}

func forkCall(t *testing.T, params string) error {
	_, err := admitted[forkParams](t, params)
	return err
}

func snapshotCall(t *testing.T, params string) error {
	_, err := admitted[snapshotParams](t, params)
	return err
}

func fileCall(t *testing.T, params string) error {
	_, err := admitted[fsPathParams](t, params)
	return err
}
