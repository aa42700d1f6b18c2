package egress

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Secret is a value the sandbox never sees: its environment holds a
// placeholder under Name, and the proxy puts Value in place of the
// placeholder in the headers of requests to Hosts (names or wildcards),
// and with Query in their query strings too (URL-encoded).
type Secret struct {
	Name  string   `json:"name"`
	Value string   `json:"value"`
	Hosts []string `json:"hosts"`
	Query bool     `json:"query,omitempty"`
}

// Bounds on the secrets of one session.
const (
	maxSecrets       = 32
	maxSecretValue   = 8192
	maxSecretHosts   = 32
	placeholderBytes = 16
)

// ParseSecrets reads the wire's secrets list strictly and validates it.
func ParseSecrets(raw json.RawMessage, field string) ([]Secret, error) {
	var list []Secret
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&list); err != nil {
		return nil, boxerr.Validation(field, `%s: not a list of {"name", "value", "hosts", "query"} (%v)`, field, err)
	}
	if err := ValidateSecrets(list, field); err != nil {
		return nil, err
	}
	return list, nil
}

// ValidateSecrets checks names, values and hosts; errors name the entry,
// never the value.
func ValidateSecrets(list []Secret, field string) error {
	if len(list) > maxSecrets {
		return boxerr.Validation(field, "%s: %d secrets, at most %d", field, len(list), maxSecrets)
	}
	seen := map[string]bool{}
	for i, s := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		if _, err := s.rules(); err != nil {
			return boxerr.Validation(f+".hosts", "%s.hosts: %v", f, err)
		}
		switch {
		case !validEnvName(s.Name):
			return boxerr.Validation(f+".name", "%s.name: %q is not an environment variable name (letters, digits, _; not starting with a digit)", f, clipText(s.Name))
		case seen[s.Name]:
			return boxerr.Validation(f+".name", "%s.name: %s appears twice", f, s.Name)
		case s.Value == "" || len(s.Value) > maxSecretValue:
			return boxerr.Validation(f+".value", "%s.value: must be 1..%d bytes", f, maxSecretValue)
		case strings.ContainsAny(s.Value, "\r\n\x00"):
			return boxerr.Validation(f+".value", "%s.value: must not contain CR, LF or NUL (it goes into HTTP headers)", f)
		}
		seen[s.Name] = true
	}
	return nil
}

// rules are the secret's hosts as name rules (no addresses, no ports: the
// proxy must know the name to carry a secret).
func (s Secret) rules() ([]Rule, error) {
	if len(s.Hosts) == 0 || len(s.Hosts) > maxSecretHosts {
		return nil, fmt.Errorf("1..%d host names", maxSecretHosts)
	}
	out := make([]Rule, 0, len(s.Hosts))
	for _, h := range s.Hosts {
		r, err := ParseRule(h)
		if err != nil {
			return nil, err
		}
		if r.Prefix.IsValid() || r.Port != 0 {
			return nil, fmt.Errorf("%q: a host name or *.wildcard without a port", clipText(h))
		}
		out = append(out, r)
	}
	return out, nil
}

func validEnvName(s string) bool {
	if s == "" || len(s) > 128 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// sessionSecret is a secret with its placeholder and parsed hosts.
type sessionSecret struct {
	name, value, placeholder string
	hosts                    []Rule
	query                    bool
}

// Restored is what an attachment carries over from an earlier one of the
// same session (Config.Restore): the policy a live update gave it (nil:
// the Attachment's), and its secrets (nil: the Attachment's) with the
// Identity they had.
type Restored struct {
	Policy   *Policy
	Secrets  []Secret
	Identity Identity
}

// Identity is what a session's secrets keep across attachments: the
// sandbox's environment holds their placeholders and its trust bundle the
// session CA's certificate. CAKey is PKCS #8 DER, CACert DER.
type Identity struct {
	Placeholders map[string]string `json:"placeholders"`
	CAKey        []byte            `json:"ca_key,omitempty"`
	CACert       []byte            `json:"ca_cert,omitempty"`
}

// newSessionSecrets gives each secret its placeholder: the one in kept
// under its name when it looks like one of ours, else a new random one.
func newSessionSecrets(list []Secret, kept map[string]string) ([]sessionSecret, error) {
	out := make([]sessionSecret, 0, len(list))
	for _, s := range list {
		hosts, err := s.rules()
		if err != nil {
			return nil, err
		}
		ph := kept[s.Name]
		if !validPlaceholder(ph) {
			b := make([]byte, placeholderBytes)
			if _, err := rand.Read(b); err != nil {
				return nil, err
			}
			ph = placeholderPrefix + hex.EncodeToString(b)
		}
		out = append(out, sessionSecret{name: s.Name, value: s.Value, placeholder: ph, hosts: hosts, query: s.Query})
	}
	return out, nil
}

const placeholderPrefix = "boxrt-secret-"

// validPlaceholder: the shape newSessionSecrets makes (its query-string
// use needs no escaping, and a header cannot be split by it).
func validPlaceholder(p string) bool {
	hexPart, ok := strings.CutPrefix(p, placeholderPrefix)
	if !ok || len(hexPart) != 2*placeholderBytes {
		return false
	}
	_, err := hex.DecodeString(hexPart)
	return err == nil
}

func (s sessionSecret) forHost(name string) bool {
	return anyRule(s.hosts, func(r Rule) bool { return r.matchesName(name, 0) })
}

// secretsFor are the secrets that carry to name.
func secretsFor(list []sessionSecret, name string) []sessionSecret {
	var out []sessionSecret
	for _, s := range list {
		if s.forHost(name) {
			out = append(out, s)
		}
	}
	return out
}

// insertSecrets puts each secret's value in place of its placeholder in
// the header values, inside Basic credentials too (base64 hides the
// placeholder from a plain search).
func insertSecrets(h http.Header, secrets []sessionSecret) {
	replaceInHeader(h, secrets, func(s sessionSecret) (string, string) { return s.placeholder, s.value })
	for _, key := range []string{"Authorization", "Proxy-Authorization"} {
		values := h[key]
		for i, v := range values {
			values[i] = replaceInBasic(v, secrets)
		}
	}
}

// insertSecretsInQuery puts the value of each secret configured for
// query strings in place of its placeholder there, URL-encoded (the
// placeholder needs no encoding: letters, digits and dashes).
func insertSecretsInQuery(u *url.URL, secrets []sessionSecret) {
	for _, s := range secrets {
		if s.query {
			u.RawQuery = strings.ReplaceAll(u.RawQuery, s.placeholder, url.QueryEscape(s.value))
		}
	}
}

// scrubForms are the forms in which a host may send the secrets back: the
// values, and the URL-encoded values of those that went in a query string
// (a redirect's Location, say).
func scrubForms(secrets []sessionSecret) []sessionSecret {
	out := secrets
	for _, s := range secrets {
		if enc := url.QueryEscape(s.value); s.query && enc != s.value {
			if len(out) == len(secrets) {
				out = slices.Clone(secrets)
			}
			s.value = enc
			out = append(out, s)
		}
	}
	return out
}

// replaceInHeader replaces, in every header value, each secret's old
// string by its new one (pair says which is which).
func replaceInHeader(h http.Header, secrets []sessionSecret, pair func(sessionSecret) (old, new string)) {
	for _, values := range h {
		for i, v := range values {
			for _, s := range secrets {
				o, n := pair(s)
				v = strings.ReplaceAll(v, o, n)
			}
			values[i] = v
		}
	}
}

// scrubSecrets turns a value a server echoed back into its placeholder, so
// a response header does not carry it into the sandbox.
func scrubSecrets(h http.Header, secrets []sessionSecret) {
	replaceInHeader(h, secrets, func(s sessionSecret) (string, string) { return s.value, s.placeholder })
}

func replaceInBasic(v string, secrets []sessionSecret) string {
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return v
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return v
	}
	plain := string(raw)
	for _, s := range secrets {
		plain = strings.ReplaceAll(plain, s.placeholder, s.value)
	}
	if plain == string(raw) {
		return v
	}
	return scheme + " " + base64.StdEncoding.EncodeToString([]byte(plain))
}

// scrubBody is a response body with each secret's value turned back into
// its placeholder as it streams (a server echoing a request must not hand
// the value to the sandbox). It holds back len(longest value)-1 bytes so a
// value split across reads is still found.
type scrubBody struct {
	r       io.ReadCloser
	secrets []sessionSecret
	keep    int
	buf     []byte
	pending []byte
	out     []byte
	err     error
}

func newScrubBody(r io.ReadCloser, secrets []sessionSecret) *scrubBody {
	keep := 0
	for _, s := range secrets {
		keep = max(keep, len(s.value)-1)
	}
	return &scrubBody{r: r, secrets: secrets, keep: keep, buf: make([]byte, 32<<10)}
}

func (s *scrubBody) Read(b []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		n, err := s.r.Read(s.buf)
		s.pending = append(s.pending, s.buf[:n]...)
		for _, sec := range s.secrets {
			s.pending = bytes.ReplaceAll(s.pending, []byte(sec.value), []byte(sec.placeholder))
		}
		cut := len(s.pending) - s.keep
		if err != nil {
			cut, s.err = len(s.pending), err
		}
		if cut > 0 {
			s.out = append(s.out[:0], s.pending[:cut]...)
			s.pending = append(s.pending[:0], s.pending[cut:]...)
		}
	}
	n := copy(b, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *scrubBody) Close() error { return s.r.Close() }
