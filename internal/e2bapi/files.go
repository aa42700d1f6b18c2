package e2bapi

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"

	"github.com/boxrt/boxrt/backends"
)

// maxUpload bounds one POST /files body; the session's own quota bounds
// what lands on its disk.
const maxUpload = 1 << 30

// entryJSON is envd's EntryInfo of a written file.
type entryJSON struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// download is GET /files?path=…: the file's bytes.
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p := r.URL.Query().Get("path")
	rc, fi, err := h.rt.Files().Read(ctx, sandboxOf(ctx).logical, p, 0, -1)
	if err != nil {
		writeRuntimeError(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(fi.Path)}))
	w.WriteHeader(http.StatusOK)
	_, _ = io.CopyN(w, rc, fi.Size)
}

// upload is POST /files: one octet-stream body to ?path=, or multipart
// parts named "file", each to ?path= or, without it, to its filename.
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sb := sandboxOf(ctx)
	r.Body = http.MaxBytesReader(w, r.Body, maxUpload)
	target := r.URL.Query().Get("path")
	write := func(p string, src io.Reader) bool {
		if _, err := h.rt.Files().Write(ctx, sb.logical, p, src, backends.WriteOptions{}); err != nil {
			writeRuntimeError(w, err)
			return false
		}
		return true
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		if target == "" {
			writeError(w, http.StatusBadRequest, "path is required for an octet-stream upload")
			return
		}
		if write(target, r.Body) {
			writeJSON(w, http.StatusOK, []entryJSON{{Name: path.Base(target), Type: "file", Path: target}})
		}
		return
	}
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "the body is not multipart/form-data: "+err.Error())
		return
	}
	var out []entryJSON
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad multipart body: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			continue
		}
		p := target
		if p == "" {
			p = part.FileName()
		}
		if p == "" {
			writeError(w, http.StatusBadRequest, "a file part needs ?path= or a filename")
			return
		}
		if !write(p, part) {
			return
		}
		out = append(out, entryJSON{Name: path.Base(p), Type: "file", Path: p})
	}
	if len(out) == 0 {
		writeError(w, http.StatusBadRequest, "the multipart body has no part named \"file\"")
		return
	}
	writeJSON(w, http.StatusOK, out)
}
