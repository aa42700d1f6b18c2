package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// scenarioFiles measures moving one large file into and out of a session
// through the files endpoint (GET/PUT /v1/sessions/{id}/files), against
// the tool a person would use without boxrt: `docker cp` for docker, a
// plain `cp` to the session's workspace directory on the host for bwrap.
func (b *bench) scenarioFiles(ctx context.Context) *Scenario {
	cfg := b.cfg
	sizeMiB := 512
	if cfg.quick {
		sizeMiB = 64
	}
	sc := &Scenario{Title: "File upload and download"}
	sc.Intro = fmt.Sprintf("Per run, one %d MiB file of random bytes is uploaded into `/workspace` with "+
		"`PUT /v1/sessions/{id}/files` and downloaded again with `GET` (curl-like: a local file streamed as the body, the body "+
		"streamed into a local file), on one warm session per backend. p50 is the time per transfer, ops/s transfers per second; "+
		"the MiB/s table below divides the size by the median time. **Baseline:** docker — `docker cp` of the same file into and "+
		"out of the session's container (the CLI through the Engine's archive endpoints); bwrap — a plain `cp` to and from the "+
		"session's workspace directory on the host (no sandbox semantics at all: the upper bound of the disk).", sizeMiB)

	src := filepath.Join(b.workDir, "files-src.bin")
	if err := writeRandomFile(src, int64(sizeMiB)<<20); err != nil {
		sc.Skipped = "cannot make the test file: " + err.Error()
		return sc
	}
	defer os.Remove(src)

	type leg struct {
		backend          string
		up, down         *Measure
		baseUp, baseDown *Measure
	}
	legs := []*leg{
		{"docker", newMeasure("boxrt docker PUT"), newMeasure("boxrt docker GET"), newMeasure("`docker cp` in"), newMeasure("`docker cp` out")},
		{"bwrap", newMeasure("boxrt bwrap PUT"), newMeasure("boxrt bwrap GET"), newMeasure("`cp` into the workspace dir"), newMeasure("`cp` out of the workspace dir")},
	}
	for _, l := range legs {
		sc.Rows = append(sc.Rows,
			Row{Case: l.backend + " upload", Boxrt: l.up, Base: l.baseUp},
			Row{Case: l.backend + " download", Boxrt: l.down, Base: l.baseDown})
		if !b.wantBackend(l.backend) {
			for _, m := range []*Measure{l.up, l.down, l.baseUp, l.baseDown} {
				m.Unavailable = skippedBackend
			}
			continue
		}
		b.filesLeg(ctx, l.backend, src, int64(sizeMiB), l.up, l.down, l.baseUp, l.baseDown)
	}
	table := "| case | boxrt MiB/s | baseline MiB/s |\n|---|---:|---:|\n"
	for _, r := range sc.Rows {
		table += fmt.Sprintf("| %s | %s | %s |\n", r.Case, mibPerSec(r.Boxrt, sizeMiB), mibPerSec(r.Base, sizeMiB))
	}
	sc.Tables = append(sc.Tables, table)
	return sc
}

func mibPerSec(m *Measure, sizeMiB int) string {
	if !m.ok() || m.P50() <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", float64(sizeMiB)/m.P50().Seconds())
}

func writeRandomFile(p string, size int64) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	_, err = io.CopyN(f, rand.Reader, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// filesLeg measures one backend: its boxrt and its baseline, cfg.reps
// runs of one transfer each way.
func (b *bench) filesLeg(ctx context.Context, backend, src string, sizeMiB int64, up, down, baseUp, baseDown *Measure) {
	all := []*Measure{up, down, baseUp, baseDown}
	unavailable := func(err error) {
		for _, m := range all {
			m.Unavailable = err.Error()
		}
	}
	p, err := b.startBackend(ctx, "files-"+backend, backend, true, nil)
	if err != nil {
		unavailable(err)
		return
	}
	defer p.stop(30 * time.Second)
	sid := "bench-files-" + backend
	var info struct {
		BackendSessionID string `json:"backend_session_id"`
	}
	params := map[string]any{"session_id": sid, "workspace_quota_mb": 3*sizeMiB + 256}
	if err := p.rpc.CallInto(ctx, "box_create_session", params, &info); err != nil {
		unavailable(err)
		return
	}
	defer deleteSession(context.WithoutCancel(ctx), p.rpc, sid)
	var st struct {
		InstanceID string `json:"instance_id"`
	}
	_ = p.rpc.CallInto(ctx, "box_status", nil, &st)
	dst := filepath.Join(b.workDir, "files-dst-"+backend+".bin")
	defer os.Remove(dst)
	endpoint := "http://" + p.addr + "/v1/sessions/" + url.PathEscape(sid) + "/files?path="

	// The baselines' view of the same workspace.
	var baseIn, baseOut func() error
	switch backend {
	case "docker":
		baseIn = func() error {
			_, err := runCmd(ctx, "docker", "cp", src, info.BackendSessionID+":/workspace/base.bin")
			return err
		}
		baseOut = func() error {
			_, err := runCmd(ctx, "docker", "cp", info.BackendSessionID+":/workspace/base.bin", dst)
			return err
		}
	case "bwrap":
		ws := filepath.Join("/run/boxrt/bwrap", st.InstanceID, info.BackendSessionID, "fs", "workspace")
		if _, err := os.Stat(ws); err != nil {
			baseUp.Unavailable, baseDown.Unavailable = "workspace directory not found on the host: "+firstLine(err.Error()), "see upload"
		}
		baseIn = func() error {
			_, err := runCmd(ctx, "cp", src, filepath.Join(ws, "base.bin"))
			return err
		}
		baseOut = func() error {
			_, err := runCmd(ctx, "cp", filepath.Join(ws, "base.bin"), dst)
			return err
		}
	}
	put := func() error {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, endpoint+url.QueryEscape("/workspace/up.bin"), f)
		if err != nil {
			return err
		}
		req.ContentLength = sizeMiB << 20
		return b.filesDo(req, io.Discard)
	}
	get := func() error {
		f, err := os.Create(dst)
		if err != nil {
			return err
		}
		defer f.Close()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+url.QueryEscape("/workspace/up.bin"), nil)
		if err != nil {
			return err
		}
		return b.filesDo(req, f)
	}
	for rep := 0; rep < b.cfg.reps && ctx.Err() == nil; rep++ {
		timeOps(ctx, up, 1, func(int) error { return put() })
		timeOps(ctx, down, 1, func(int) error { return checkSize(dst, get(), sizeMiB) })
		if baseUp.Unavailable == "" {
			timeOps(ctx, baseUp, 1, func(int) error { return baseIn() })
			timeOps(ctx, baseDown, 1, func(int) error { return checkSize(dst, baseOut(), sizeMiB) })
		}
	}
}

// filesDo sends one files-endpoint request with the bench token and
// copies a 200 answer's body into w.
func (b *bench) filesDo(req *http.Request, w io.Writer) error {
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// checkSize passes err on, or checks that p holds the whole file.
func checkSize(p string, err error, sizeMiB int64) error {
	if err != nil {
		return err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.Size() != sizeMiB<<20 {
		return fmt.Errorf("%s holds %d bytes, want %d", p, fi.Size(), sizeMiB<<20)
	}
	return nil
}
