package relay

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPortRewrite: the session's server gets the path below the port's
// prefix and the query without the token, and none of boxrt's
// credentials; the request's own headers and cookies pass.
func TestPortRewrite(t *testing.T) {
	p := &Ports{control: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer control" }}
	in := httptest.NewRequest("POST", "http://boxrt/v1/sessions/s%2F1/ports/8000/a%20b/c?token=T&x=1", nil)
	in.Header.Set("Authorization", "Bearer control")
	in.Header.Set(HeaderPortToken, "T")
	in.Header.Set("X-LangBot-Box-Control-Token", "lb")
	in.Header.Set("Sec-WebSocket-Protocol", "mcp, boxrt.bearer.Y29udHJvbA, chat")
	in.Header.Set("X-App", "kept")
	in.AddCookie(&http.Cookie{Name: PortTokenCookie, Value: "T"})
	in.AddCookie(&http.Cookie{Name: "app", Value: "kept"})
	in = in.WithContext(context.WithValue(in.Context(), portTargetKey{}, portTarget{session: "s/1", port: 8000}))
	out := in.Clone(in.Context())
	p.rewrite(&httputil.ProxyRequest{In: in, Out: out})

	assert.Equal(t, "/a b/c", out.URL.Path)
	assert.Equal(t, "/a%20b/c", out.URL.EscapedPath())
	assert.Equal(t, "x=1", out.URL.RawQuery)
	assert.Equal(t, "127.0.0.1:8000", out.Host)
	assert.Equal(t, "http", out.URL.Scheme)
	for _, h := range []string{"Authorization", HeaderPortToken, "X-LangBot-Box-Control-Token"} {
		assert.Empty(t, out.Header.Get(h), h)
	}
	assert.Equal(t, "mcp, chat", out.Header.Get("Sec-WebSocket-Protocol"))
	assert.Equal(t, "kept", out.Header.Get("X-App"))
	assert.Equal(t, "app=kept", out.Header.Get("Cookie"))

	// Another session's request to the same port gets another host: the
	// transport's idle connections are never shared between sessions.
	other := in.WithContext(context.WithValue(in.Context(), portTargetKey{}, portTarget{session: "s2", port: 8000}))
	out2 := other.Clone(other.Context())
	p.rewrite(&httputil.ProxyRequest{In: other, Out: out2})
	assert.NotEqual(t, out.URL.Host, out2.URL.Host)

	// An app's own Authorization passes.
	in.Header.Set("Authorization", "Bearer app")
	out3 := in.Clone(in.Context())
	p.rewrite(&httputil.ProxyRequest{In: in, Out: out3})
	assert.Equal(t, "Bearer app", out3.Header.Get("Authorization"))
}

func TestPortRouteRefusals(t *testing.T) {
	p := &Ports{}
	for _, port := range []string{"0", "65536", "08000", "x"} {
		r := httptest.NewRequest("GET", "http://boxrt/v1/sessions/s/ports/"+port+"/", nil)
		r.SetPathValue("session_id", "s")
		r.SetPathValue("port", port)
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		assert.Equal(t, http.StatusNotFound, w.Code, port)
		assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	}
}
