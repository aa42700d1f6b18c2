package e2bapi

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/boxrt/boxrt/internal/e2bapi/envd/filesystem/filesystemconnect"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process/processconnect"
)

// maxMessage bounds one Connect message (a stdin write, a listing
// request); the SDKs send far less.
const maxMessage = 4 << 20

type sandboxKey struct{}

// sandboxOf is the sandbox the envd middleware put in ctx.
func sandboxOf(ctx context.Context) *sandbox {
	sb, _ := ctx.Value(sandboxKey{}).(*sandbox)
	return sb
}

// envd is the in-sandbox API: the sandbox is the one E2b-Sandbox-Id names
// within the request's scope, and the caller must hold its access token.
func (h *Handler) envd() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxMessage), connect.WithSendMaxBytes(maxMessage)}
	mux.Handle(processconnect.NewProcessHandler(&processService{h: h}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{h: h}, opts...))
	mux.HandleFunc("GET /files", h.download)
	mux.HandleFunc("POST /files", h.upload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rpc := strings.HasPrefix(r.URL.Path, "/process.") || strings.HasPrefix(r.URL.Path, "/filesystem.")
		refuse := func(status int, code connect.Code, msg string) {
			if rpc {
				writeConnectError(w, status, code, msg)
			} else {
				writeError(w, status, msg)
			}
		}
		ctx := h.scoped(r)
		id := r.Header.Get("E2b-Sandbox-Id")
		if id == "" {
			refuse(http.StatusBadRequest, connect.CodeInvalidArgument, "the E2b-Sandbox-Id header must name the sandbox")
			return
		}
		var sb *sandbox
		if details, err := h.rt.GetSession(ctx, id); err == nil {
			sb, err = h.adopt(ctx, id, details.SessionInfo, adopted)
			if err != nil {
				sb = nil
			}
		}
		if r.URL.Path == "/health" && r.Method == http.MethodGet {
			if sb == nil {
				refuse(http.StatusBadGateway, connect.CodeUnavailable, "sandbox "+id+" is not running")
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if sb == nil {
			// E2B's proxy answers a sandbox that is gone with 502; its SDKs
			// read that as "sandbox not found".
			refuse(http.StatusBadGateway, connect.CodeUnavailable, "sandbox "+id+" not found")
			return
		}
		tok := r.Header.Get("X-Access-Token")
		if tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(sb.token)) != 1 {
			refuse(http.StatusUnauthorized, connect.CodeUnauthenticated, "the sandbox's envdAccessToken must be sent as X-Access-Token")
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(ctx, sandboxKey{}, sb)))
	})
}
