package egress

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestParseRoundTrips(t *testing.T) {
	for _, in := range []string{
		`"off"`, `"on"`,
		`{"allow":["pypi.org","*.github.com:443","10.0.0.0/8","203.0.113.7:22","[2001:db8::1]:443","fc00::/7"],"deny":["evil.example"]}`,
	} {
		p, err := Parse([]byte(in), "network")
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		out, _ := json.Marshal(p)
		if string(out) != in {
			t.Errorf("%s came back as %s", in, out)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for in, want := range map[string]string{
		`"maybe"`:                                            `network: "maybe" is not a policy`,
		`{"allow":["ok.test","bad host"]}`:                   `network.allow[1]: "bad host": not a host name`,
		`{"allow":["a.test:0"]}`:                             `network.allow[0]: "a.test:0": port must be 1..65535`,
		`{"allow":["a.test:99999"]}`:                         `port must be 1..65535`,
		`{"deny":["10.0.0.1/8"]}`:                            `network.deny[0]: "10.0.0.1/8": host bits set (did you mean 10.0.0.0/8?)`,
		`{"allow":["*"]}`:                                    `not a host name`,
		`{"allow":["*.-bad.test"]}`:                          `not a wildcard over a host name`,
		`{"allow":["[10.0.0.1]:80"]}`:                        `brackets are for IPv6`,
		`{"allow":["fe80::1%eth0"]}`:                         `an address with a zone`,
		`{"allow":[],"other":1}`:                             `unknown field "other"`,
		`{"allow":"pypi.org"}`:                               `not a policy`,
		`{"allow":["` + strings.Repeat("a", 64) + `.test"]}`: `not a host name`,
	} {
		_, err := Parse([]byte(in), "network")
		if !errors.Is(err, boxerr.ErrValidation) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want a validation error containing %q", in, err, want)
		}
	}
	many := `{"allow":[` + strings.Repeat(`"a.test",`, maxRules) + `"a.test"]}`
	if _, err := Parse([]byte(many), "network"); !errors.Is(err, boxerr.ErrValidation) {
		t.Errorf("%d rules accepted", maxRules+1)
	}
}

func TestDecide(t *testing.T) {
	special := func(a netip.Addr) bool {
		return isSpecial(a, map[netip.Addr]bool{netip.MustParseAddr("198.51.100.1"): true})
	}
	pub := netip.MustParseAddrPort("93.184.216.34:443")
	priv := netip.MustParseAddrPort("10.1.2.3:443")
	own := netip.MustParseAddrPort("198.51.100.1:443")
	meta := netip.MustParseAddrPort("169.254.169.254:80")
	meta443 := netip.AddrPortFrom(meta.Addr(), 443)
	rules := `{"allow":["api.test:443","*.pkg.test","10.1.2.0/24:443"],"deny":["bad.pkg.test","93.184.216.99"]}`
	for _, c := range []struct {
		policy string
		t      target
		want   string
	}{
		{`"off"`, target{dst: pub}, reasonOff},
		{`"on"`, target{dst: pub}, ""},
		{`"on"`, target{dst: priv}, reasonPrivate},
		{`"on"`, target{dst: own}, reasonPrivate},
		{`"on"`, target{dst: meta}, reasonPrivate},
		{`"on"`, target{name: "x.test", dst: priv, resolved: true, fromHosts: true}, ""},
		{`{"allow":[],"deny":["x.test"]}`, target{name: "x.test", dst: pub}, reasonDenied},
		{`{"allow":[]}`, target{name: "x.test", dst: pub, resolved: true}, reasonNotAllow},
		{rules, target{name: "api.test", dst: pub, resolved: true}, ""},
		{rules, target{name: "api.test", dst: pub}, reasonMismatch},
		{rules, target{name: "api.test", dst: netip.AddrPortFrom(pub.Addr(), 80), resolved: true}, reasonNotAllow},
		{rules, target{name: "a.b.pkg.test", dst: pub, resolved: true}, ""},
		{rules, target{name: "pkg.test", dst: pub, resolved: true}, reasonNotAllow},
		{rules, target{name: "bad.pkg.test", dst: pub, resolved: true}, reasonDenied},
		{rules, target{name: "api.test", dst: netip.MustParseAddrPort("93.184.216.99:443"), resolved: true}, reasonDenied},
		{rules, target{name: "api.test", dst: priv, resolved: true}, ""}, // the CIDR rule names it
		{rules, target{name: "api.test", dst: meta443, resolved: true}, reasonPrivate},
		{rules, target{name: "api.test", dst: meta443, resolved: true, fromHosts: true}, ""},
		{rules, target{dst: priv}, ""},
		{rules, target{dst: pub}, reasonNotAllow},
	} {
		if got := mustParse(t, c.policy).decide(c.t, special); got != c.want {
			t.Errorf("%s %+v: got %q, want %q", c.policy, c.t, got, c.want)
		}
	}
}

func TestValidateSecrets(t *testing.T) {
	ok := Secret{Name: "API_TOKEN", Value: "v", Hosts: []string{"api.test", "*.api.test"}}
	for _, c := range []struct {
		s    Secret
		want string
	}{
		{Secret{Name: "1X", Value: "v", Hosts: []string{"a.test"}}, "secrets[1].name"},
		{Secret{Name: "X", Value: "", Hosts: []string{"a.test"}}, "secrets[1].value: must be"},
		{Secret{Name: "X", Value: "a\r\nInjected: 1", Hosts: []string{"a.test"}}, "must not contain CR"},
		{Secret{Name: "X", Value: "v", Hosts: nil}, "secrets[1].hosts"},
		{Secret{Name: "X", Value: "v", Hosts: []string{"10.0.0.1"}}, "a host name or *.wildcard"},
		{Secret{Name: "API_TOKEN", Value: "v", Hosts: []string{"a.test"}}, "appears twice"},
	} {
		err := ValidateSecrets([]Secret{ok, c.s}, "secrets")
		if !errors.Is(err, boxerr.ErrValidation) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.s, err, c.want)
		}
		if err != nil && c.s.Value != "" && c.s.Value != "v" && strings.Contains(err.Error(), c.s.Value) {
			t.Errorf("the error quotes the value: %v", err)
		}
	}
}

func TestInsertSecretsInBasicAuth(t *testing.T) {
	secrets, err := newSessionSecrets([]Secret{{Name: "PW", Value: "hunter2", Hosts: []string{"api.test"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://api.test/", nil)
	req.SetBasicAuth("me", secrets[0].placeholder)
	insertSecrets(req.Header, secrets)
	if user, pw, _ := req.BasicAuth(); user != "me" || pw != "hunter2" {
		t.Errorf("basic auth: %q %q", user, pw)
	}
}

func TestInsertSecretsInQuery(t *testing.T) {
	secrets, err := newSessionSecrets([]Secret{
		{Name: "Q", Value: "a b&c=d", Hosts: []string{"api.test"}, Query: true},
		{Name: "H", Value: "header-only", Hosts: []string{"api.test"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	q, h := secrets[0].placeholder, secrets[1].placeholder
	tests := []struct{ name, query, want string }{
		{"a secret configured for queries", "key=" + q + "&x=1", "key=a+b%26c%3Dd&x=1"},
		{"a header-only secret stays a placeholder", "key=" + h, "key=" + h},
		{"no placeholder", "key=plain", "key=plain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, _ := url.Parse("http://api.test/p?" + tt.query)
			insertSecretsInQuery(u, secrets)
			if u.RawQuery != tt.want {
				t.Errorf("query %q, want %q", u.RawQuery, tt.want)
			}
			if u.Query().Get("key") == "a b&c=d" != (tt.want != tt.query) {
				t.Errorf("decoded key %q", u.Query().Get("key"))
			}
		})
	}
	// What the host sends back is scrubbed in both forms.
	hdr := http.Header{"Location": {"/next?key=a+b%26c%3Dd"}, "X-Echo": {"a b&c=d"}}
	scrubSecrets(hdr, scrubForms(secrets))
	if hdr.Get("Location") != "/next?key="+q || hdr.Get("X-Echo") != q {
		t.Errorf("scrubbed headers: %v", hdr)
	}
}

func TestScrubBodyAcrossReads(t *testing.T) {
	secrets := []sessionSecret{{value: "0123456789", placeholder: "PH"}}
	body := strings.Repeat("x", 5) + "0123456789" + strings.Repeat("y", 7) + "0123456789"
	r := newScrubBody(nopCloser{&oneByte{body}}, secrets)
	var got strings.Builder
	buf := make([]byte, 3)
	for {
		n, err := r.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if want := "xxxxxPHyyyyyyyPH"; got.String() != want {
		t.Errorf("got %q, want %q", got.String(), want)
	}
}

type oneByte struct{ s string }

func (o *oneByte) Read(b []byte) (int, error) {
	if o.s == "" {
		return 0, io.EOF
	}
	b[0], o.s = o.s[0], o.s[1:]
	return 1, nil
}

type nopCloser struct{ *oneByte }

func (nopCloser) Close() error { return nil }

func TestSessionCAIsLimitedToSecretHosts(t *testing.T) {
	secrets, err := newSessionSecrets([]Secret{{Name: "T", Value: "v", Hosts: []string{"api.test", "*.svc.test"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := newSessionCA("s", secrets)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	for name, ok := range map[string]bool{"api.test": true, "a.svc.test": true, "other.test": false, "svc.test": false} {
		leaf, err := ca.leaf(name)
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots})
		if (err == nil) != ok {
			t.Errorf("%s: verify %v, want ok=%v", name, err, ok)
		}
	}
}

// TestIdentityKeptAcrossAttachments: the placeholders and CA a session's
// identity records come back in a later attachment; what does not look
// like ours is replaced, and a CA whose key does not match is refused.
func TestIdentityKeptAcrossAttachments(t *testing.T) {
	list := []Secret{{Name: "A", Value: "v", Hosts: []string{"api.test"}}, {Name: "B", Value: "w", Hosts: []string{"b.test"}}}
	first, err := newSessionSecrets(list, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := newSessionCA("s", first)
	if err != nil {
		t.Fatal(err)
	}
	id, err := (&Session{secrets: first, ca: ca}).Identity()
	if err != nil {
		t.Fatal(err)
	}
	id.Placeholders["B"] = "boxrt-secret-not-hex\r\nX: y"
	again, err := newSessionSecrets(list, id.Placeholders)
	if err != nil {
		t.Fatal(err)
	}
	if again[0].placeholder != first[0].placeholder {
		t.Errorf("placeholder A %q, kept %q", again[0].placeholder, first[0].placeholder)
	}
	if !validPlaceholder(again[1].placeholder) || again[1].placeholder == id.Placeholders["B"] {
		t.Errorf("placeholder B %q taken from a record that does not look like ours", again[1].placeholder)
	}
	kept, err := sessionCAFor("s", again, id)
	if err != nil || !kept.cert.Equal(ca.cert) || !kept.key.Equal(ca.key) {
		t.Fatalf("kept CA: %v", err)
	}
	other, err := newSessionCA("other", again)
	if err != nil {
		t.Fatal(err)
	}
	id.CACert = other.cert.Raw
	if _, err := sessionCAFor("s", again, id); err == nil {
		t.Fatal("a CA certificate with another key was accepted")
	}
}
