package test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// documented lists the methods of docs/protocol.md's method table.
func documented(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join("..", "docs", "protocol.md"))
	require.NoError(t, err)
	var out []string
	for _, m := range regexp.MustCompile("(?m)^\\| \\[`([^`]+)`\\]\\(").FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

// wireCalls lists where this package's tests send each method: a string
// literal naming it as an argument of a call (p.Call("box_x", …),
// p.MustCall, ws.Call, the live and LangBot clients, helpers taking the
// method), or in a request row of a table test (a composite literal that
// also holds the params, as LangBot's {name, action, data, …} rows). A
// name in a comment, a raw JSON line or a bare list of names is not a
// request and does not count.
func wireCalls(t *testing.T, methods []string) map[string][]string {
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	sent := map[string][]string{}
	note := func(e ast.Expr) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return
		}
		if s, err := strconv.Unquote(lit.Value); err == nil && slices.Contains(methods, s) {
			sent[s] = append(sent[s], fset.Position(lit.Pos()).String())
		}
	}
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				for _, arg := range n.Args {
					note(arg)
				}
			case *ast.CompositeLit:
				if isRequestRow(n) {
					for _, e := range n.Elts {
						note(e)
					}
				}
			}
			return true
		})
	}
	return sent
}

// isRequestRow is an unkeyed composite literal that carries, beside
// strings, some params: a map, struct, call or variable.
func isRequestRow(c *ast.CompositeLit) bool {
	for _, e := range c.Elts {
		switch e.(type) {
		case *ast.KeyValueExpr:
			return false
		case *ast.CompositeLit, *ast.CallExpr, *ast.Ident:
			return true
		}
	}
	return false
}

// TestEveryMethodHasAWireTest: the dispatcher's catalogue and the method
// table of docs/protocol.md name the same methods, and each is sent by at
// least one black-box test of this package (all of which run the real
// binary on a real backend). A new method without a wire test fails here.
// It is a static check of the test sources, so it holds under -run and
// -short too; what it cannot see is a call in a test that never runs,
// which the skip report of scripts/test makes visible.
func TestEveryMethodHasAWireTest(t *testing.T) {
	methods := catalogue()
	require.Greater(t, len(methods), 50, "the catalogue came back nearly empty: %v", methods)
	docs := documented(t)
	require.NotEmpty(t, docs, "no method table found in docs/protocol.md")
	assert.ElementsMatch(t, methods, docs, "docs/protocol.md's method table and the dispatcher's catalogue differ")
	sent := wireCalls(t, methods)
	for _, m := range methods {
		if len(sent[m]) == 0 {
			t.Errorf("%s has no wire test in test/: add one that sends it to the real binary and checks the answer", m)
		}
	}
}
