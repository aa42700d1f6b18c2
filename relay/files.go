package relay

import (
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
)

// Files serves a session's files over plain HTTP, next to the relay:
//
//	GET /v1/sessions/{session_id}/files?path=…[&offset=N][&length=N]
//	PUT /v1/sessions/{session_id}/files?path=…[&mode=0644][&append=1]
//
// Bodies stream in both directions through a fixed buffer, so a file of
// any size moves with boxrt's memory flat; the box_fs_* RPC methods carry
// base64 in one JSON message and stop at runtime.MaxRPCFileBytes. Paths
// are sandbox paths, percent-encoded, so any byte of a file name travels.
// The caller (serve) puts the control token check in front. As on the
// relay, a request with the LangBot headers names a session of that
// placement by its physical id; one without them is the default
// namespace.
type Files struct {
	rt    *runtime.Runtime
	log   zerolog.Logger
	scope Scope
}

// NewFiles returns the files handler for rt; scope may be nil (no
// Workspaces).
func NewFiles(rt *runtime.Runtime, log zerolog.Logger, scope Scope) *Files {
	return &Files{rt: rt, log: log, scope: scope}
}

// Response headers of a download.
const (
	HeaderFileSize = "X-Boxrt-File-Size"
	HeaderFileMode = "X-Boxrt-File-Mode"
)

// copyBufferBytes is a download's copy buffer: fixed, so memory does not
// grow with the file, and large, so a GiB costs few syscalls.
const copyBufferBytes = 256 << 10

func (f *Files) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, sessionID, ok := scoped(f.scope, r, r.PathValue("session_id"))
	if !ok {
		writeError(w, boxerr.SessionNotFound(r.PathValue("session_id")))
		return
	}
	r = r.WithContext(ctx)
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		writeError(w, boxerr.Validation("path", "the path query parameter is required"))
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		f.get(w, r, sessionID, p)
	case http.MethodPut:
		f.put(w, r, sessionID, p)
	default:
		w.Header().Set("Allow", "GET, HEAD, PUT")
		rpc.WriteHTTPError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "use GET to download and PUT to upload")
	}
}

// intParam reads an optional non-negative integer query parameter.
func intParam(r *http.Request, name string, def int64, base int) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, base, 64)
	if err != nil || n < 0 {
		return 0, boxerr.Validation(name, "%s must be a non-negative integer, got %q", name, v)
	}
	return n, nil
}

func (f *Files) get(w http.ResponseWriter, r *http.Request, sessionID, p string) {
	offset, err := intParam(r, "offset", 0, 10)
	if err != nil {
		writeError(w, err)
		return
	}
	length, err := intParam(r, "length", -1, 10)
	if err != nil {
		writeError(w, err)
		return
	}
	rc, fi, err := f.rt.Files().Read(r.Context(), sessionID, p, offset, length)
	if err != nil {
		writeError(w, err)
		return
	}
	defer rc.Close()
	n := max(fi.Size-offset, 0)
	if length >= 0 {
		n = min(n, length)
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	h.Set(HeaderFileSize, strconv.FormatInt(fi.Size, 10))
	h.Set(HeaderFileMode, "0"+strconv.FormatUint(uint64(fi.Mode), 8))
	h.Set("Last-Modified", fi.MTime.UTC().Format(http.TimeFormat))
	if r.Method == http.MethodHead {
		return
	}
	start := time.Now()
	copied, err := io.CopyBuffer(w, io.LimitReader(rc, n), make([]byte, copyBufferBytes))
	// Headers are gone: a failure can only cut the body short, which the
	// client sees against Content-Length.
	ev := f.log.Debug()
	if err != nil {
		ev = f.log.Warn().Err(err)
	}
	ev.Str("session_id", sessionID).Int64("bytes", copied).Dur("took", time.Since(start)).Msg("file download")
}

type putResult struct {
	Path         string `json:"path"`
	BytesWritten int64  `json:"bytes_written"`
}

func (f *Files) put(w http.ResponseWriter, r *http.Request, sessionID, p string) {
	mode, err := intParam(r, "mode", 0, 8)
	if err == nil && mode > 0o777 {
		err = boxerr.Validation("mode", "mode must be octal permission bits up to 0777, got %q", r.URL.Query().Get("mode"))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	opts := backends.WriteOptions{Mode: fs.FileMode(mode)}
	switch v := r.URL.Query().Get("append"); v {
	case "", "0", "false":
	case "1", "true":
		opts.Append = true
	default:
		writeError(w, boxerr.Validation("append", "append must be 1/true or 0/false, got %q", v))
		return
	}
	start := time.Now()
	n, err := f.rt.Files().Write(r.Context(), sessionID, p, r.Body, opts)
	if err != nil {
		writeError(w, err)
		return
	}
	f.log.Debug().Str("session_id", sessionID).Int64("bytes", n).Dur("took", time.Since(start)).Msg("file upload")
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(putResult{Path: p, BytesWritten: n})
}
