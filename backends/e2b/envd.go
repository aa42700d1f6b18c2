package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/filesystem/filesystemconnect"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process/processconnect"
)

// Bounds of envd calls.
const (
	// maxMessage bounds one Connect message from envd (an output chunk, a
	// listing); envd sends output in far smaller pieces.
	maxMessage = 4 << 20
	// callTimeout bounds a unary envd call.
	callTimeout = time.Minute
)

// sandbox is one sandbox's envd as boxrt reaches it.
type sandbox struct {
	id    string
	base  string // envd's URL
	http  *http.Client
	proc  processconnect.ProcessClient
	files filesystemconnect.FilesystemClient

	mu       sync.Mutex
	extended time.Time // when its timeout was last set
}

// headers puts the sandbox's routing header and access token on every
// envd request.
type headers struct {
	base  http.RoundTripper
	id    string
	token string
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	if h.token != "" {
		r.Header.Set("X-Access-Token", h.token)
	}
	return h.base.RoundTrip(r)
}

// remember keeps the envd clients of a sandbox the control API described.
func (b *Backend) remember(s sandboxJSON) *sandbox {
	base := ""
	if b.sandbox != nil {
		base = b.sandbox.String()
	} else {
		domain := b.cfg.Domain
		if s.Domain != nil && *s.Domain != "" {
			domain = *s.Domain
		}
		base = fmt.Sprintf("https://%d-%s.%s", envdPort, s.SandboxID, domain)
	}
	hc := &http.Client{Transport: headers{base: b.http.Transport, id: s.SandboxID, token: s.EnvdAccessToken}}
	opts := []connect.ClientOption{connect.WithReadMaxBytes(maxMessage), connect.WithSendMaxBytes(maxMessage)}
	sb := &sandbox{id: s.SandboxID, base: base, http: hc,
		proc:  processconnect.NewProcessClient(hc, base, opts...),
		files: filesystemconnect.NewFilesystemClient(hc, base, opts...), extended: time.Now()}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sandboxes[s.SandboxID] = sb
	return sb
}

func (b *Backend) forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.sandboxes, id)
}

// envd returns the session's sandbox clients, asking the control API for
// its access token when this process has not seen it (after a restart),
// and keeps the sandbox's timeout ahead.
func (b *Backend) envd(ctx context.Context, info backends.Session) (*sandbox, error) {
	b.mu.Lock()
	sb := b.sandboxes[info.BackendSessionID]
	b.mu.Unlock()
	if sb == nil {
		var out sandboxJSON
		if err := b.control(ctx, http.MethodGet, "/sandboxes/"+info.BackendSessionID, nil, &out); err != nil {
			return nil, err
		}
		if out.SandboxID == "" {
			out.SandboxID = info.BackendSessionID
		}
		if out.SandboxID != info.BackendSessionID {
			return nil, boxerr.Failure("e2b backend: asked for sandbox %s, the E2B API described %.80q", info.BackendSessionID, out.SandboxID)
		}
		if err := out.check(); err != nil {
			return nil, err
		}
		sb = b.remember(out)
	}
	b.touch(ctx, sb)
	return sb, nil
}

// envdError turns a failed envd call into a typed error. NotFound on a
// path is the file's absence; refusals the caller can fix name field;
// a sandbox envd does not serve is errGone.
func envdError(field, path string, err error) error {
	if err == nil {
		return nil
	}
	var be *boxerr.Error
	if errors.As(err, &be) {
		return err
	}
	code := connect.CodeOf(err)
	msg := quote(err.Error())
	if ce := (*connect.Error)(nil); errors.As(err, &ce) {
		msg = quote(ce.Message())
	}
	switch code {
	case connect.CodeNotFound:
		if path != "" {
			return boxerr.FileNotFound(path).Wrap(err)
		}
	case connect.CodeInvalidArgument, connect.CodeAlreadyExists, connect.CodeFailedPrecondition, connect.CodePermissionDenied, connect.CodeOutOfRange:
		e := boxerr.Validation(field, "%s: %s", field, msg)
		if path != "" {
			e = e.With("path", path)
		}
		return e.Wrap(err)
	case connect.CodeUnavailable:
		return boxerr.Failure("e2b backend: %s: %s", errGone, msg).Wrap(errors.Join(errGone, err))
	case connect.CodeUnauthenticated:
		return boxerr.Failure("e2b backend: the sandbox's envd refused its access token: %s", msg).Wrap(err)
	case connect.CodeResourceExhausted:
		return boxerr.Failure("e2b backend: envd: %s (an answer over %d bytes is refused)", msg, maxMessage).Wrap(err)
	}
	return boxerr.Failure("e2b backend: envd: %s", msg).Wrap(err)
}

// unary bounds a unary envd call in time.
func unary(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, callTimeout)
}

// shellWord quotes s for sh.
func shellWord(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
