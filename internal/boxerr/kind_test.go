package boxerr_test

import (
	"errors"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// The wire table in docs/protocol.md and the one in code must be the same
// rows: hosts are written against the doc.
func TestTableMatchesProtocolDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(\\w+)` \\| (-3\\d{4}) \\| \\**(true|false)\\**? \\|")
	documented := map[string]boxerr.Kind{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		code, _ := strconv.ParseInt(m[2], 10, 64)
		documented[m[1]] = boxerr.Kind{Type: m[1], Code: code, Retryable: m[3] == "true"}
	}
	if len(documented) != len(boxerr.Kinds) {
		t.Errorf("docs/protocol.md documents %d error types, the code has %d", len(documented), len(boxerr.Kinds))
	}
	for _, k := range boxerr.Kinds {
		d, ok := documented[k.Type]
		switch {
		case !ok:
			t.Errorf("%s is not in docs/protocol.md's error tables", k.Type)
		case d != *k:
			t.Errorf("docs/protocol.md says %+v, the code says %+v", d, *k)
		}
	}
}

func TestCodesAreUnique(t *testing.T) {
	seen := map[int64]string{}
	for _, k := range boxerr.Kinds {
		if other, dup := seen[k.Code]; dup {
			t.Errorf("code %d used by %s and %s", k.Code, other, k.Type)
		}
		seen[k.Code] = k.Type
		if boxerr.ByCode(k.Code) != k {
			t.Errorf("ByCode(%d) is not %s", k.Code, k.Type)
		}
	}
}

func TestErrorMatchesItsKindOnly(t *testing.T) {
	err := boxerr.Validation("limits.max_sessions", "must be positive")
	if !errors.Is(err, boxerr.ErrValidation) {
		t.Fatal("a validation error does not match ErrValidation")
	}
	if errors.Is(err, boxerr.ErrBox) {
		t.Fatal("a validation error matches ErrBox")
	}
}
