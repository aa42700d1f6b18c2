// Package fake is what skipreport's test runs go test -json on: a test
// that passes, one that fails, one that skips, and a subtest that skips.
package fake

import "testing"

func TestPasses(t *testing.T) { t.Log("passing output is not shown") }

func TestFails(t *testing.T) { t.Error("the failure shown") }

func TestSkipsTop(t *testing.T) { t.Skip("no widget here") }

func TestParent(t *testing.T) {
	t.Run("child", func(t *testing.T) { t.Skipf("needs %s", "root") })
	t.Run("runs", func(t *testing.T) {})
}
