package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
)

// PortsRoute is the pattern of an exposed port's URL; a path below it is
// the path the session's server is asked for.
const PortsRoute = "/v1/sessions/{session_id}/ports/{port}/"

// Where a port token may travel: a header, the ?token= query parameter (a
// browser link), or the cookie a query token sets for the port's path, so
// the page's own links and requests keep working.
const (
	HeaderPortToken = "X-Boxrt-Port-Token"
	PortTokenQuery  = "token"
	PortTokenCookie = "boxrt_port_token"
)

// Ports reverse-proxies an exposed port: HTTP of any method, bodies
// streamed both ways, and WebSocket upgrades, to 127.0.0.1:<port> inside
// the session, reached through the backend (runtime.PortDialer). Access
// needs the exposure's token (runtime.Ports.Authorize); the control token
// does not open it, and neither the token nor boxrt's credentials are
// passed on to the session. As on the relay, a request with the LangBot
// headers names a session of that placement only.
type Ports struct {
	rt    *runtime.Runtime
	log   zerolog.Logger
	scope Scope
	// control reports a request carrying boxrt's control token, which is
	// then not passed on (nil: none is recognised).
	control func(*http.Request) bool
	proxy   *httputil.ReverseProxy
}

// portTarget is the session and port a proxied request goes to: the
// transport's dial reads it from the request's context.
type portTarget struct {
	session string
	port    int
}

type portTargetKey struct{}

// NewPorts returns the exposed ports' handler for rt; scope and control
// may be nil.
func NewPorts(rt *runtime.Runtime, log zerolog.Logger, scope Scope, control func(*http.Request) bool) *Ports {
	p := &Ports{rt: rt, log: log, scope: scope, control: control}
	p.proxy = newPortProxy(func(ctx context.Context) (net.Conn, error) {
		t, ok := ctx.Value(portTargetKey{}).(portTarget)
		if !ok {
			return nil, errors.New("no exposed port in the request")
		}
		return rt.Ports().Dial(ctx, t.session, t.port)
	}, p.rewrite, p.proxyError)
	return p
}

// newPortProxy is the reverse proxy to the ports dial reaches.
func newPortProxy(dial func(context.Context) (net.Conn, error), rewrite func(*httputil.ProxyRequest),
	proxyError func(http.ResponseWriter, *http.Request, error)) *httputil.ReverseProxy {
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := dial(ctx)
			if tcp, ok := c.(*net.TCPConn); ok && err == nil {
				return newPortConn(tcp), nil
			}
			return c, err
		},
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	// Without a FlushInterval, a body of unknown length (a stream, server-
	// sent events) is still flushed at every write; one of known length
	// moves through large buffers, or by splice when large
	// (portsplice.go).
	return &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      transport,
		BufferPool:     proxyBuffers{},
		ModifyResponse: spliceLarge,
		ErrorHandler:   proxyError,
	}
}

func (p *Ports) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	physical := r.PathValue("session_id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != r.PathValue("port") {
		rpc.WriteHTTPError(w, http.StatusNotFound, "BoxValidationError", "the port in the path must be a number between 1 and 65535")
		return
	}
	if _, _, ok := scoped(p.scope, r, physical); !ok {
		writeError(w, boxerr.SessionNotFound(physical))
		return
	}
	token, fromQuery := portToken(r)
	if err := p.rt.Ports().Authorize(physical, port, token); err != nil {
		rpc.WriteHTTPError(w, http.StatusUnauthorized, "Unauthorized",
			"this port needs its token from box_expose_port ("+HeaderPortToken+" header or ?token=): "+err.Error())
		return
	}
	if fromQuery {
		http.SetCookie(w, &http.Cookie{Name: PortTokenCookie, Value: token, Path: runtime.PortPath(physical, port),
			HttpOnly: true, SameSite: http.SameSiteLaxMode})
	}
	ctx := context.WithValue(r.Context(), portTargetKey{}, portTarget{session: physical, port: port})
	p.proxy.ServeHTTP(w, r.WithContext(withSplice(ctx, w)))
}

// portToken finds the request's token: header, then query, then cookie.
func portToken(r *http.Request) (token string, fromQuery bool) {
	if t := r.Header.Get(HeaderPortToken); t != "" {
		return t, false
	}
	if t := r.URL.Query().Get(PortTokenQuery); t != "" {
		return t, true
	}
	if c, err := r.Cookie(PortTokenCookie); err == nil {
		return c.Value, false
	}
	return "", false
}

// rewrite sends the request to the session's server: the path below the
// port's prefix, the token and boxrt's credentials removed. The URL's
// host names the session and port uniquely, so the transport's idle
// connections are never handed to another session's request.
func (p *Ports) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(portTargetKey{}).(portTarget)
	sum := sha256.Sum256([]byte(t.session))
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = "s" + hex.EncodeToString(sum[:16]) + ".port:" + strconv.Itoa(t.port)
	pr.Out.Host = "127.0.0.1:" + strconv.Itoa(t.port)
	rest := "/"
	if parts := strings.SplitN(pr.In.URL.EscapedPath(), "/", 7); len(parts) == 7 {
		rest += parts[6]
	}
	pr.Out.URL.RawPath = rest
	pr.Out.URL.Path, _ = url.PathUnescape(rest)
	q := pr.Out.URL.Query()
	if q.Has(PortTokenQuery) {
		q.Del(PortTokenQuery)
		pr.Out.URL.RawQuery = q.Encode()
	}
	pr.Out.Header.Del(HeaderPortToken)
	pr.Out.Header.Del("X-LangBot-Box-Control-Token")
	if p.control != nil && p.control(pr.In) {
		pr.Out.Header.Del("Authorization")
	}
	dropBearerProtocols(pr.Out.Header)
	dropCookie(pr.Out, PortTokenCookie)
	pr.SetXForwarded()
}

// dropBearerProtocols removes the WebSocket subprotocols that carry a
// boxrt token (rpc.BearerSubprotocolPrefix).
func dropBearerProtocols(h http.Header) {
	const name = "Sec-Websocket-Protocol"
	var keep []string
	for _, v := range h.Values(name) {
		for _, proto := range strings.Split(v, ",") {
			if proto = strings.TrimSpace(proto); proto != "" && !strings.HasPrefix(proto, rpc.BearerSubprotocolPrefix) {
				keep = append(keep, proto)
			}
		}
	}
	h.Del(name)
	if len(keep) > 0 {
		h.Set(name, strings.Join(keep, ", "))
	}
}

// dropCookie removes one cookie from the request's Cookie headers.
func dropCookie(r *http.Request, name string) {
	cookies := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cookies {
		if c.Name != name {
			r.AddCookie(c)
		}
	}
}

// proxyError answers a request the session's server could not take: 502
// with a JSON body saying why (nothing listens, no sandbox), 404 for a
// session gone meanwhile.
func (p *Ports) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, boxerr.ErrSessionNotFound) {
		writeError(w, err)
		return
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away
	}
	t, _ := r.Context().Value(portTargetKey{}).(portTarget)
	p.log.Debug().Err(err).Str("session_id", t.session).Int("port", t.port).Msg("exposed port unreachable")
	rpc.WriteHTTPError(w, http.StatusBadGateway, "BadGateway",
		"cannot reach port "+strconv.Itoa(t.port)+" in session "+t.session+" (is a server listening on 127.0.0.1 there?): "+err.Error())
}

// proxyBufferBytes is a proxied body's copy buffer: large, so a download
// costs few syscalls.
const proxyBufferBytes = 256 << 10

var proxyBufferPool = sync.Pool{New: func() any { b := make([]byte, proxyBufferBytes); return &b }}

// proxyBuffers lends the reverse proxy its copy buffers.
type proxyBuffers struct{}

func (proxyBuffers) Get() []byte  { return *proxyBufferPool.Get().(*[]byte) }
func (proxyBuffers) Put(b []byte) { proxyBufferPool.Put(&b) }
