package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// finalCleanup removes whatever this run left in Docker — containers and
// volumes of the boxrt instances it started, and the harness's own
// containers — and records what it found. Other installations' containers
// (other boxrt instances on this machine) are never touched.
func (b *bench) finalCleanup() {
	if strings.HasPrefix(b.machine.Docker, "unavailable") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	filters := []string{benchLabel + "=" + b.token}
	ids := make([]string, 0, len(b.instances))
	for id := range b.instances {
		if id != "" {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		filters = append(filters, "boxrt.instance="+id)
	}
	leftC, leftV := 0, 0
	for _, f := range filters {
		out, err := runCmd(ctx, "docker", "ps", "-aq", "--filter", "label="+f)
		if err != nil {
			b.cleanup = append(b.cleanup, "could not list containers: "+firstLine(err.Error()))
			return
		}
		if c := strings.Fields(out); len(c) > 0 {
			leftC += len(c)
			_, _ = runCmd(ctx, "docker", append([]string{"rm", "-f", "-v"}, c...)...)
		}
		out, err = runCmd(ctx, "docker", "volume", "ls", "-q", "--filter", "label="+f)
		if err == nil {
			if v := strings.Fields(out); len(v) > 0 {
				leftV += len(v)
				_, _ = runCmd(ctx, "docker", append([]string{"volume", "rm", "-f"}, v...)...)
			}
		}
	}
	if leftC == 0 && leftV == 0 {
		b.cleanup = append(b.cleanup, fmt.Sprintf("No container or volume of this run's %d boxrt instances (or of the harness) was left behind: boxrt's deletes and reaper removed everything.", len(ids)))
	} else {
		b.cleanup = append(b.cleanup, fmt.Sprintf("The harness found and removed %d containers and %d volumes left behind by this run's boxrt instances (boxrt did not remove them itself).", leftC, leftV))
	}
	// verify
	still := 0
	for _, f := range filters {
		if out, err := runCmd(ctx, "docker", "ps", "-aq", "--filter", "label="+f); err == nil {
			still += len(strings.Fields(out))
		}
	}
	if still > 0 {
		b.cleanup = append(b.cleanup, fmt.Sprintf("**%d containers could not be removed.**", still))
	}
	if out, err := runCmd(ctx, "docker", "ps", "-aq", "--filter", "label=boxrt.managed"); err == nil {
		if n := len(strings.Fields(out)); n > 0 {
			b.cleanup = append(b.cleanup, fmt.Sprintf("`docker ps -a --filter label=boxrt.managed` still lists %d containers of other boxrt installations on this machine (not this run's; left alone).", n))
		} else {
			b.cleanup = append(b.cleanup, "`docker ps -a --filter label=boxrt.managed` is empty.")
		}
	}
}
