package runtime

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
)

// TestCompatibilityFields holds everything that names the compatibility
// fields to the one table: the sandbox the backends persist, SessionInfo's
// JSON, the order comparison reports in, and the docs.
func TestCompatibilityFields(t *testing.T) {
	var names []string
	for _, f := range compatibilityFields {
		names = append(names, f.name)
	}

	t.Run("every sandbox field but extra_mounts", func(t *testing.T) {
		var keys []string
		typ := reflect.TypeFor[backends.Sandbox]()
		for i := range typ.NumField() {
			key, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if key != "extra_mounts" {
				keys = append(keys, key)
			}
		}
		assert.ElementsMatch(t, keys, names)
	})

	t.Run("SessionInfo shows each", func(t *testing.T) {
		raw, err := json.Marshal(SessionInfo{backends.Session{SessionID: "s", Sandbox: backends.DefaultSandboxSpec().Sandbox}})
		require.NoError(t, err)
		var got map[string]any
		require.NoError(t, json.Unmarshal(raw, &got))
		for _, n := range names {
			assert.Contains(t, got, n)
		}
	})

	// Each field in turn differs, and so does every later one: the one
	// named is the field itself, so comparison follows the table's order.
	for i, f := range compatibilityFields {
		t.Run("conflict names "+f.name, func(t *testing.T) {
			have := backends.DefaultSandboxSpec().Sandbox
			want := have
			w := reflect.ValueOf(&want).Elem()
			for _, later := range compatibilityFields[i:] {
				v := w.Field(later.index)
				switch v.Kind() {
				case reflect.String:
					v.SetString(v.String() + "x")
				case reflect.Bool:
					v.SetBool(!v.Bool())
				case reflect.Int:
					v.SetInt(v.Int() + 1)
				case reflect.Float64:
					v.SetFloat(v.Float() + 1)
				default:
					t.Fatalf("no way to change %s (%s)", later.name, v.Kind())
				}
			}
			field, _, _ := compatibility(have, want)
			assert.Equal(t, f.name, field)
		})
	}

	docs := []struct {
		name, file string
		// list matches the sentence that lists the fields in order.
		list *regexp.Regexp
	}{
		{"protocol.md", "../docs/protocol.md", regexp.MustCompile(`(?s)\*\*Compatibility fields\.\*\*.*?differs: (.*?)\. ` + "`image`")},
		{"operations.md", "../docs/operations.md", regexp.MustCompile(`(?s)\*\*Compatibility\.\*\* An existing session must match (.*?) \(in\s+that order\)`)},
	}
	for _, d := range docs {
		t.Run(d.name+" lists them in order", func(t *testing.T) {
			doc, err := os.ReadFile(d.file)
			require.NoError(t, err)
			m := d.list.FindSubmatch(doc)
			require.NotNil(t, m, "the compatibility sentence is gone from %s", d.file)
			assert.Equal(t, names, backticked(string(m[1])))
		})
	}
	t.Run("protocol.md's SessionInfo table shows them", func(t *testing.T) {
		doc, err := os.ReadFile("../docs/protocol.md")
		require.NoError(t, err)
		_, table, ok := strings.Cut(string(doc), "### SessionInfo")
		require.True(t, ok)
		table, _, _ = strings.Cut(table, "\n### ")
		var documented []string
		for _, line := range strings.Split(table, "\n") {
			if strings.HasPrefix(line, "| `") {
				cell, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
				documented = append(documented, backticked(cell)...)
			}
		}
		for _, n := range names {
			assert.True(t, slices.Contains(documented, n), "%s is not in the SessionInfo table", n)
		}
	})
}

func backticked(s string) []string {
	var out []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}
