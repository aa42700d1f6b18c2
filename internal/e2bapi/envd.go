package e2bapi

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/boxrt/boxrt/internal/boxerr"
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
// and whose access token the caller holds (the control API made or gave
// it); the call runs in that sandbox's placement.
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
		id := r.Header.Get("E2b-Sandbox-Id")
		if id == "" {
			refuse(http.StatusBadRequest, connect.CodeInvalidArgument, "the E2b-Sandbox-Id header must name the sandbox")
			return
		}
		sb, known := h.sandboxes.find(id, r.Header.Get("X-Access-Token"))
		var ctx context.Context
		if sb != nil {
			ctx = sb.context(r.Context())
			if _, err := h.rt.GetSession(ctx, id); errors.Is(err, boxerr.ErrSessionNotFound) {
				h.sandboxes.remove(sb.physical)
				sb, known = nil, false
			} else if err != nil {
				refuse(boxerr.HTTPStatus(err), connect.CodeOf(connectError(err)), err.Error())
				return
			}
		}
		switch {
		case sb == nil && known:
			refuse(http.StatusUnauthorized, connect.CodeUnauthenticated, "the sandbox's envdAccessToken must be sent as X-Access-Token")
			return
		case sb == nil:
			// E2B's proxy answers a sandbox that is gone with 502; its SDKs
			// read that as "sandbox not running".
			refuse(http.StatusBadGateway, connect.CodeUnavailable, "sandbox "+id+" is not running")
			return
		case r.URL.Path == "/health" && r.Method == http.MethodGet:
			w.WriteHeader(http.StatusNoContent)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(ctx, sandboxKey{}, sb)))
	})
}
