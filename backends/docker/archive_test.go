package docker

import (
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/assert"
)

func TestLayerPaths(t *testing.T) {
	add, mod, del := container.ChangeAdd, container.ChangeModify, container.ChangeDelete
	for _, tc := range []struct {
		name    string
		changes map[string]container.ChangeType
		want    []string
	}{
		{"an added directory covers its children",
			map[string]container.ChangeType{"/opt": mod, "/opt/tool": add, "/opt/tool/bin": add, "/opt/tool/bin/x": add},
			[]string{"/opt/tool"}},
		{"a changed directory is left to its children, a changed file is taken",
			map[string]container.ChangeType{"/usr": mod, "/usr/local": mod, "/usr/local/bin": mod, "/usr/local/bin/mytool": add, "/etc/motd": mod},
			[]string{"/etc/motd", "/usr/local/bin/mytool"}},
		{"deletions are not recorded",
			map[string]container.ChangeType{"/etc": mod, "/etc/issue": del},
			nil},
		{"mounts, their parents and engine files are skipped",
			map[string]container.ChangeType{"/workspace": add, "/data": mod, "/data/extra": add, "/etc/hosts": mod, "/root": mod, "/root/.profile": add},
			[]string{"/root/.profile"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var changes []container.FilesystemChange
			for p, k := range tc.changes {
				changes = append(changes, container.FilesystemChange{Path: p, Kind: k})
			}
			got := layerPaths(changes, append([]string{"/workspace", "/data/extra"}, engineManaged...))
			assert.Equal(t, tc.want, got)
		})
	}
}
