package main

import (
	"os/exec"
	"path"
	"strings"
	"testing"
)

// TestDependencyDirection pins the import graph docs/architecture.md draws:
// main → internal/cli → internal/server → actions → runtime → backends,
// with rpc, relay, reconnect and the error package at the edges, and
// internal/ leaves (clip, keyed, fdsafe, statelock, atomicfile, logsink,
// controltoken, sandboxagent, agentboot) any of them may use. Each package
// lists the boxrt packages it may import; a package missing from the table
// fails, so a new one is placed deliberately.
func TestDependencyDirection(t *testing.T) {
	const module = "github.com/boxrt/boxrt"
	allowed := map[string][]string{
		".":                            {"internal/cli", "internal/fdsafe"},
		"internal/cli":                 {"actions", "backends", "backends/e2b", "backends/kube", "internal/backendfactory", "internal/controltoken", "internal/dialout", "internal/logsink", "internal/sandboxagent", "internal/server", "reconnect", "runtime"},
		"internal/server":              {"actions", "internal/backendfactory", "internal/e2bapi", "internal/mcpserver", "internal/clip", "internal/controltoken", "internal/dialout", "internal/statelock", "relay", "rpc", "runtime", "runtime/skills"},
		"internal/backendfactory":      {"backends", "backends/bwrap", "backends/docker", "backends/e2b", "backends/host", "backends/kube", "internal/boxerr", "runtime"},
		"internal/controltoken":        {"internal/atomicfile"},
		"internal/mcpserver":           {"actions", "internal/boxerr", "rpc"},
		"internal/logsink":             {},
		"internal/dialout":             {},
		"internal/e2bapi":              {"actions", "backends", "internal/atomicfile", "internal/boxerr", "internal/e2bapi/envd/process", "internal/e2bapi/envd/process/processconnect", "internal/e2bapi/envd/filesystem", "internal/e2bapi/envd/filesystem/filesystemconnect", "runtime", "runtime/tenant"},
		"internal/e2bapi/envd":         {},
		"internal/e2bapi/envd/process": {},
		"internal/e2bapi/envd/process/processconnect":       {"internal/e2bapi/envd/process"},
		"internal/e2bapi/envd/filesystem":                   {},
		"internal/e2bapi/envd/filesystem/filesystemconnect": {"internal/e2bapi/envd/filesystem"},
		"actions":                     {"rpc", "runtime", "runtime/skills", "runtime/snapshots", "internal/boxerr", "runtime/tenant", "backends", "internal/clip"},
		"runtime":                     {"backends", "internal/egress", "runtime/skills", "runtime/snapshots", "internal/boxerr", "runtime/tenant", "internal/clip", "internal/keyed", "internal/atomicfile"},
		"runtime/skills":              {"internal/boxerr", "internal/keyed"},
		"runtime/snapshots":           {"internal/boxerr"},
		"internal/boxerr":             {},
		"runtime/tenant":              {"internal/boxerr"},
		"backends":                    {"internal/boxerr", "internal/egress"},
		"backends/bwrap":              {"backends", "internal/egress", "backends/internal/sandboxsh", "backends/internal/loopdisk", "internal/netns", "internal/boxerr", "internal/atomicfile", "internal/sandboxagent", "internal/sandboxagent/agenttest"},
		"backends/docker":             {"backends", "internal/egress", "backends/internal/sandboxsh", "backends/internal/loopdisk", "backends/internal/procstat", "internal/netns", "backends/internal/sandboxfs", "backends/internal/execproc", "internal/boxerr", "internal/atomicfile", "internal/sandboxagent", "internal/sandboxagent/agenttest"},
		"backends/kube":               {"backends", "backends/internal/sandboxsh", "backends/internal/sandboxfs", "backends/internal/execproc", "internal/boxerr", "internal/sandboxagent", "internal/sandboxagent/agenttest"},
		"backends/internal/sandboxsh": {},
		"backends/internal/procstat":  {},
		"backends/internal/loopdisk":  {},
		"backends/internal/execproc":  {"backends"},
		"backends/backendtest":        {"backends", "runtime", "internal/boxerr"},
		"backends/e2b":                {"backends", "internal/boxerr", "internal/e2bapi/envd/process", "internal/e2bapi/envd/process/processconnect", "internal/e2bapi/envd/filesystem", "internal/e2bapi/envd/filesystem/filesystemconnect"},
		"backends/host":               {"backends", "internal/boxerr"},
		"backends/internal/sandboxfs": {"backends", "internal/boxerr"},
		"relay":                       {"rpc", "runtime", "internal/boxerr", "runtime/tenant", "backends"},
		"rpc":                         {"internal/boxerr"},
		"reconnect":                   {"internal/boxerr", "internal/controltoken", "internal/atomicfile", "internal/dialout"},
		"test":                        {"*"},
		"test/bench":                  {"reconnect", "internal/atomicfile", "internal/boxerr", "internal/clip", "backends", "backends/bwrap", "backends/docker", "test/bench/echopeer"},
		"test/bench/echopeer":         {},
		"internal/clip":               {},
		"internal/keyed":              {},
		"internal/fdsafe":             {},
		"scripts/skipreport":          {},
		"internal/statelock":          {},
		"internal/atomicfile":         {},
		"test/fixtures/mcpserver":     {},
		"test/fixtures/escape":        {},

		// The session agent and the static binary tests run it from.
		"internal/sandboxagent":           {"internal/agentboot", "internal/fdsafe"},
		"internal/agentboot":              {},
		"internal/sandboxagent/agenttest": {},

		// The egress proxy: a leaf the runtime and the backends use.
		"internal/egress": {"internal/boxerr", "internal/netns"},

		// Code on a thread inside another network namespace.
		"internal/netns": {},
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := rel(module, fields[0])
		rules, ok := allowed[pkg]
		if !ok {
			t.Errorf("package %s is not in the dependency table: decide what it may import", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			if !permitted(rules, rel(module, imp)) {
				t.Errorf("%s imports %s, against the dependency direction", pkg, rel(module, imp))
			}
		}
	}
}

func rel(module, importPath string) string {
	if importPath == module {
		return "."
	}
	return strings.TrimPrefix(importPath, module+"/")
}

func permitted(rules []string, imp string) bool {
	for _, r := range rules {
		if ok, _ := path.Match(r, imp); ok || r == "*" {
			return true
		}
	}
	return false
}
