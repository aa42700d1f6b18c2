package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLangBotSkillScope: every Workspace has its own skill store,
// <skills_root>/tenants/<namespace>: skill actions, skill_name mounts,
// admission's skill check and the storage analysis see only the caller's
// skills, as in the reference (§8.4, §9.1, §5.11).
func TestLangBotSkillScope(t *testing.T) {
	host, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	cfg := fmt.Sprintf(`{"enabled": true, "backend": "nsjail", "local": {"host_root": %q}}`, host)
	// The managed workspace root and the relaxed storage checks make the
	// admission subtest's runtime ready on bwrap.
	require.NoError(t, os.MkdirAll(filepath.Join(host, "default"), 0o755))
	p := startBox(t, lbOptions{Stdio: true, Config: cfg, Token: lbToken, Env: []string{unsafeStorage}})
	skillsRoot := filepath.Join(host, "skills")
	a, b := tenant("skills-a", 1), tenant("skills-b", 1)

	var created struct {
		Skill map[string]any `json:"skill"`
	}
	p.OK("box_create_skill", map[string]any{"skill": map[string]any{"name": "s1", "instructions": "hello from a"}}, a, &created)
	pkg := filepath.Join(skillsRoot, "tenants", workspaceNS("skills-a"), "s1")
	require.Equal(t, pkg, created.Skill["package_root"], "the skill lives in workspace a's store")

	names := func(ctx *lbContext) []string {
		t.Helper()
		var l struct {
			Skills []map[string]any `json:"skills"`
		}
		p.OK("box_list_skills", map[string]any{}, ctx, &l)
		out := []string{}
		for _, s := range l.Skills {
			out = append(out, s["name"].(string))
		}
		return out
	}
	assert.Equal(t, []string{"s1"}, names(a))
	assert.Empty(t, names(b), "workspace b does not see workspace a's skill")

	var got map[string]any
	p.OK("box_get_skill", map[string]any{"name": "s1"}, b, &got)
	assert.Nil(t, got["skill"])
	p.Refused("box_read_skill_file", map[string]any{"name": "s1", "path": "SKILL.md"}, b, `BoxValidationError: Skill "s1" not found`)
	p.Refused("box_write_skill_file", map[string]any{"name": "s1", "path": "x.txt", "content": "x"}, b, `BoxValidationError: Skill "s1" not found`)
	p.Refused("box_delete_skill", map[string]any{"name": "s1"}, b, `BoxValidationError: Skill "s1" not found`)
	p.Refused("box_scan_skill_directory", map[string]any{"path": pkg}, b, "BoxValidationError: scan path must stay within the skill root")
	p.Refused("box_create_skill", map[string]any{"skill": map[string]any{"name": "s1", "package_root": pkg}}, b, "BoxValidationError: package_root must stay within the skill root")

	t.Run("skill_name mounts from the caller's store", func(t *testing.T) {
		var res map[string]any
		p.OK("box_exec", map[string]any{"session_id": "k", "cmd": "cat /workspace/.skills/s1/SKILL.md", "skill_name": "s1"}, a, &res)
		assert.Contains(t, res["stdout"], "hello from a")
		p.Refused("box_exec", map[string]any{"session_id": "k", "cmd": "true", "skill_name": "s1"}, b, `BoxValidationError: Skill "s1" not found`)
		p.Refused("box_create_session", map[string]any{"session_id": "k2", "skill_name": "s1"}, b, `BoxValidationError: Skill "s1" not found`)
	})

	t.Run("storage analysis counts the caller's skills", func(t *testing.T) {
		skillsDir := func(ctx *lbContext) map[string]any {
			var sa struct {
				Directories []map[string]any `json:"directories"`
			}
			p.OK("box_get_storage_analysis", map[string]any{}, ctx, &sa)
			for _, d := range sa.Directories {
				if d["key"] == "skills" {
					return d
				}
			}
			t.Fatal("no skills directory")
			return nil
		}
		da, db := skillsDir(a), skillsDir(b)
		assert.Equal(t, filepath.Join(skillsRoot, "tenants", workspaceNS("skills-a")), da["path"])
		assert.Equal(t, float64(1), da["file_count"])
		assert.Equal(t, filepath.Join(skillsRoot, "tenants", workspaceNS("skills-b")), db["path"])
		assert.Equal(t, float64(0), db["file_count"])
	})

	t.Run("admission refuses another Workspace's skill", func(t *testing.T) {
		p.OK("box_init", map[string]any{"admission": map[string]any{"required": true, "max_grant_ttl_sec": 600}}, nil, nil)
		expires := time.Now().Add(5 * time.Minute).UTC().Format(time.RFC3339)
		aa, ab := tenant("skills-adm-a", 1), tenant("skills-adm-b", 1)
		for _, ws := range []string{"skills-adm-a", "skills-adm-b"} {
			p.OK("box_upsert_sandbox_admission_grant", map[string]any{"instance_uuid": lbInstance, "workspace_uuid": ws, "execution_generation": 1,
				"entitlement_revision": 1, "expires_at": expires, "max_sessions": 1, "max_managed_processes": 0}, nil, nil)
		}
		p.OK("box_create_skill", map[string]any{"skill": map[string]any{"name": "s1", "instructions": "hello from adm-a"}}, aa, nil)
		p.Refused("box_exec", map[string]any{"session_id": "x", "cmd": "true", "skill_name": "s1"}, ab,
			"BoxAdmissionError: Managed sandbox skill is unavailable in this Workspace")
		var res map[string]any
		p.OK("box_exec", map[string]any{"session_id": "x", "cmd": "cat /workspace/.skills/s1/SKILL.md", "skill_name": "s1"}, aa, &res)
		assert.Contains(t, res["stdout"], "hello from adm-a")
	})
}

// TestJSONRPCMetaSkillScope: in JSON-RPC mode a request with a tenant
// context uses its Workspace's store; one without keeps the single-tenant
// store, which lists none of the Workspaces' skills.
func TestJSONRPCMetaSkillScope(t *testing.T) {
	host, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	p := Start(t, Options{Stdio: true, Config: fmt.Sprintf(`{"backend":"bwrap","local":{"host_root":%q}}`, host)})
	n := 0
	call := func(method, params string, meta bool) Response {
		t.Helper()
		n++
		m := ""
		if meta {
			m = `,"meta":{"instance_uuid":"instance-a","workspace_uuid":"workspace-a","placement_generation":1}`
		}
		p.Send([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s%s}`+"\n", n, method, params, m)))
		for {
			var r Response
			require.NoError(t, json.Unmarshal(p.NextLine(time.Minute), &r))
			if string(r.ID) == fmt.Sprint(n) {
				return r
			}
		}
	}
	ok := func(method, params string, meta bool) string {
		t.Helper()
		r := call(method, params, meta)
		require.Nil(t, r.Error, "%s: %v", method, r.Error)
		return string(r.Result)
	}
	single := ok("box_create_skill", `{"skill":{"name":"plain","instructions":"single tenant"}}`, false)
	assert.Contains(t, single, `"package_root":"`+filepath.Join(host, "skills", "plain")+`"`, "no context: the store root, as before")
	scoped := ok("box_create_skill", `{"skill":{"name":"mine","instructions":"workspace a"}}`, true)
	assert.Contains(t, scoped, filepath.Join(host, "skills", "tenants", "ws-695136eeae1cb9b6af4a8226", "mine"))

	list := ok("box_list_skills", `{}`, false)
	assert.Contains(t, list, `"name":"plain"`)
	assert.NotContains(t, list, `"name":"mine"`, "the single-tenant store lists no Workspace's skills")
	list = ok("box_list_skills", `{}`, true)
	assert.Contains(t, list, `"name":"mine"`)
	assert.NotContains(t, list, `"name":"plain"`)

	out := ok("box_exec", `{"session_id":"s","cmd":"cat /workspace/.skills/plain/SKILL.md","skill_name":"plain"}`, false)
	assert.Contains(t, out, "single tenant", "no context mounts from the single-tenant store")
	r := call("box_create_skill", `{"skill":{"name":"tenants"}}`, false)
	require.NotNil(t, r.Error)
	assert.True(t, strings.HasPrefix(r.Error.Message, "BoxValidationError: "), r.Error.Message)
}
