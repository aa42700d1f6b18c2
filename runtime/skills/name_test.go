package skills

import (
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"demo", "demo", ""},
		{"  demo_skill-2  ", "demo_skill-2", ""},
		{"技能", "技能", ""},
		{strings.Repeat("a", 64), strings.Repeat("a", 64), ""},
		{"", "", "Skill name is required"},
		{"   ", "", "Skill name is required"},
		{strings.Repeat("a", 65), "", "cannot exceed 64 characters"},
		{"a/b", "", "can only contain"},
		{"..", "", "can only contain"},
		{".", "", "can only contain"},
		{"bad name!", "", "can only contain"},
		{"a\x00b", "", "can only contain"},
		{"--", "", "can only contain"},
		{`a\b`, "", "can only contain"},
	} {
		got, err := ValidateName(tc.in)
		if tc.err != "" {
			wantValidation(t, err, tc.err)
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ValidateName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSkillMD(t *testing.T) {
	for _, tc := range []struct {
		name, text   string
		meta         map[string]string
		instructions string
	}{
		{"full", "---\nname: demo\ndisplay_name: Demo\ndescription: Demo skill\n---\n\nDo it.\n",
			map[string]string{"name": "demo", "display_name": "Demo", "description": "Demo skill"}, "Do it.\n"},
		{"no marker", "Just text", map[string]string{}, "Just text"},
		{"first line not marker", "---x\nname: a\n---\nbody", map[string]string{}, "---x\nname: a\n---\nbody"},
		{"unterminated", "---\nname: a\nbody", map[string]string{}, "---\nname: a\nbody"},
		{"non-mapping yaml", "---\n- a\n- b\n---\nbody", map[string]string{}, "body"},
		{"broken yaml", "---\nname: [\n---\nbody", map[string]string{}, "body"},
		{"empty block", "---\n---\nbody", map[string]string{}, "body"},
		{"crlf", "---\r\nname: demo\r\n---\r\n\r\nbody", map[string]string{"name": "demo"}, "body"},
		{"non-string scalars", "---\nname: 123\ndescription: true\n---\nx", map[string]string{"name": "123", "description": "true"}, "x"},
		{"unknown keys ignored", "---\nname: a\nversion: 2\n---\nx", map[string]string{"name": "a"}, "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta, instr := ParseSkillMD(tc.text)
			if len(meta) != len(tc.meta) {
				t.Fatalf("meta = %v, want %v", meta, tc.meta)
			}
			for k, v := range tc.meta {
				if meta[k] != v {
					t.Fatalf("meta[%s] = %q, want %q", k, meta[k], v)
				}
			}
			if instr != tc.instructions {
				t.Fatalf("instructions = %q, want %q", instr, tc.instructions)
			}
		})
	}
}

func TestFormatSkillMDRoundTrip(t *testing.T) {
	for _, tc := range []struct{ name, display, desc, instr string }{
		{"demo", "Demo", "Demo skill", "Do it.\n"},
		{"demo", "", "", "only name"},
		{"x", "true", "123", "scalars that YAML would retype"},
		{"x", "a: b", "line one\nline two", "# heading\n\n- item\n"},
		{"技能", "技能 ✓", "Unicode — fine", "text"},
		{"x", "", strings.Repeat("long ", 100), "no folding"},
	} {
		text, err := FormatSkillMD(tc.name, tc.display, tc.desc, tc.instr)
		if err != nil {
			t.Fatal(err)
		}
		meta, instr := ParseSkillMD(text)
		if meta["name"] != tc.name || meta["display_name"] != tc.display || meta["description"] != tc.desc || instr != tc.instr {
			t.Errorf("round trip of %+v gave %v / %q from:\n%s", tc, meta, instr, text)
		}
	}
	// Blank values are dropped; none at all means instructions only.
	text, _ := FormatSkillMD("", "  ", "", "body")
	if text != "body" {
		t.Errorf("all blank: got %q", text)
	}
	text, _ = FormatSkillMD("demo", "", "Demo", "body")
	if text != "---\nname: demo\ndescription: Demo\n---\n\nbody" {
		t.Errorf("layout: got %q", text)
	}
}

func TestTargetNames(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"My Skill!.zip", "My-Skill"},
		{"", "uploaded-skill"},
		{"???.zip", "uploaded-skill"},
		{"demo.zip", "demo"},
		{`C:\Users\me\repo.tar.zip`, "repo-tar"},
		{"../../etc.zip", "etc"},
	} {
		if got := archiveStem(tc.in); got != tc.want {
			t.Errorf("archiveStem(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := sanitizeName("../x/y"); got != "x-y" {
		t.Errorf("sanitizeName = %q", got)
	}
}

func TestResolveRoot(t *testing.T) {
	abs := func(p string) string { return ResolveRoot(p, "") }
	if got := ResolveRoot("/h", ""); got != "/h/skills" {
		t.Errorf("default skills_root: %s", got)
	}
	if got := ResolveRoot("/h", "/abs/s"); got != "/abs/s" {
		t.Errorf("absolute skills_root: %s", got)
	}
	if got := ResolveRoot("/h", "custom"); got != "/h/custom" {
		t.Errorf("relative skills_root: %s", got)
	}
	if got := abs(""); !strings.HasSuffix(got, "/data/box/skills") || !strings.HasPrefix(got, "/") {
		t.Errorf("default host_root: %s", got)
	}
}
