package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Name is the backend's wire name.
const Name = "e2b"

// Defaults of the configuration keys.
const (
	DefaultAPIURL   = "https://api.e2b.app"
	DefaultDomain   = "e2b.app"
	DefaultTemplate = "base"
	// envdPort is the port E2B's proxy serves envd on in
	// https://<port>-<id>.<domain>.
	envdPort = 49983
	// maxTimeout is E2B's longest sandbox timeout (24 h).
	maxTimeout = 24 * time.Hour
	// defaultTimeout is a sandbox's timeout when the runtime reaps no idle
	// session (session_ttl_sec 0).
	defaultTimeout = time.Hour
	// timeoutMargin keeps a sandbox alive past the runtime's own idle
	// reaping, which is what should end it.
	timeoutMargin = 5 * time.Minute
)

// Metadata keys a sandbox carries so that Adopt finds this
// installation's sessions again.
const (
	metaInstance = "boxrt_instance"
	metaSession  = "boxrt_session"
	metaSandbox  = "boxrt_sandbox"
	// metaMountPath asks a boxrt endpoint for the workspace at the
	// session's mount path rather than E2B's /home/user (other endpoints
	// ignore it).
	metaMountPath = "boxrt_mount_path"
)

// Config configures the backend (the configuration's e2b section).
type Config struct {
	InstanceID string
	// APIKey is sent as X-API-Key (E2B_API_KEY; boxrt's control token for
	// another boxrt).
	APIKey string
	// APIURL is the control API (E2B_API_URL; http://HOST:PORT/e2b for
	// another boxrt).
	APIURL string
	// SandboxURL, when set, is every sandbox's envd (E2B_SANDBOX_URL;
	// http://HOST:PORT/e2b/envd for another boxrt); else envd is at
	// https://49983-<id>.<domain>.
	SandboxURL string
	// Domain is the sandbox domain when the create answer names none.
	Domain string
	// Template is the default image: the E2B template new sessions use.
	Template string
	// SessionTTL is the runtime's idle TTL: a sandbox's E2B timeout is a
	// little longer and is extended while the session is used.
	SessionTTL time.Duration
}

var (
	_ backends.Suspender = (*Backend)(nil)
	_ backends.Census    = (*Backend)(nil)
)

// Backend runs sessions as E2B sandboxes.
type Backend struct {
	cfg     Config
	api     *url.URL
	sandbox *url.URL // nil: E2B's per-sandbox host
	http    *http.Client
	timeout time.Duration

	mu        sync.Mutex
	sandboxes map[string]*sandbox // by sandbox id
}

// New returns the backend; it does no I/O.
func New(cfg Config) (*Backend, error) {
	if cfg.InstanceID == "" {
		return nil, errors.New("e2b backend: an instance id is required")
	}
	if cfg.APIKey == "" {
		return nil, boxerr.Validation("e2b.api_key", "e2b.api_key is required for the e2b backend (or set E2B_API_KEY)")
	}
	if cfg.APIURL == "" {
		cfg.APIURL = DefaultAPIURL
	}
	if cfg.Domain == "" {
		cfg.Domain = DefaultDomain
	}
	if cfg.Template == "" {
		cfg.Template = DefaultTemplate
	}
	b := &Backend{cfg: cfg, http: newHTTPClient(), sandboxes: map[string]*sandbox{}}
	var err error
	if b.api, err = endpoint("e2b.api_url", cfg.APIURL); err != nil {
		return nil, err
	}
	if cfg.SandboxURL != "" {
		if b.sandbox, err = endpoint("e2b.sandbox_url", cfg.SandboxURL); err != nil {
			return nil, err
		}
	}
	b.timeout = defaultTimeout
	if cfg.SessionTTL > 0 {
		b.timeout = min(cfg.SessionTTL+timeoutMargin, maxTimeout)
	}
	return b, nil
}

// endpoint checks a configured URL: http or https, a host, no
// credentials, query or fragment.
func endpoint(key, raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, boxerr.Validation(key, "%s must be an http or https URL without credentials, query or fragment, got %q", key, raw)
	}
	return u, nil
}

// newHTTPClient bounds connecting and waiting for an answer's head; the
// bodies of streams have no overall deadline (each call sets its own).
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}}
}

// Close releases idle connections.
func (b *Backend) Close() error {
	b.http.CloseIdleConnections()
	return nil
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return Name }

// DefaultImage implements backends.Backend: the configured template.
func (b *Backend) DefaultImage() string { return b.cfg.Template }

// Describe implements backends.Backend.
func (b *Backend) Describe() backends.Description {
	return backends.Description{
		EnforcedLimits:  []string{},
		Isolation:       "remote E2B sandbox at " + b.api.Host,
		IsolationLevels: []string{},
		Notes: []string{
			"limits (cpus, memory_mb, pids_limit, workspace quota) are the E2B template's; boxrt does not set them",
			"host_path and extra mounts are refused: a remote sandbox cannot bind host directories",
			"network off asks E2B for no internet access (allow_internet_access false); the endpoint enforces it",
			"E2B's envd sends only SIGKILL and SIGTERM: other signals reach a command as SIGTERM",
		},
	}
}

// Probe implements backends.Backend: the control API answers a listing
// with the key.
func (b *Backend) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out []json.RawMessage
	return b.control(ctx, http.MethodGet, "/v2/sandboxes?limit=1", nil, &out)
}

// sandboxID is the form of an id an endpoint may hand out: it goes into
// URL paths, a header and a host name.
// The patterns with counted repetitions are compiled on first use: each
// costs milliseconds to compile, which every boxrt process, the session
// agent among them, would otherwise pay at start.
var sandboxID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`) })

// accessToken is the form of an envd access token.
var accessToken = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[\x21-\x7e]{0,512}$`) })

// sandboxJSON is what create, connect and get answer (Sandbox,
// SandboxDetail), as far as boxrt reads it.
type sandboxJSON struct {
	SandboxID       string            `json:"sandboxID"`
	EnvdAccessToken string            `json:"envdAccessToken"`
	Domain          *string           `json:"domain"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
}

// check validates what the endpoint said about a sandbox.
func (s sandboxJSON) check() error {
	if !sandboxID().MatchString(s.SandboxID) {
		return boxerr.Failure("the E2B endpoint answered a malformed sandbox id %.80q", s.SandboxID)
	}
	if !accessToken().MatchString(s.EnvdAccessToken) {
		return boxerr.Failure("the E2B endpoint answered a malformed envd access token for sandbox %s", s.SandboxID)
	}
	if s.Domain != nil && *s.Domain != "" && !validDomain(*s.Domain) {
		return boxerr.Failure("the E2B endpoint answered a malformed domain %.80q", *s.Domain)
	}
	return nil
}

var domainName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?$`) })

func validDomain(d string) bool { return domainName().MatchString(d) }

// newSandboxBody is E2B's NewSandbox.
type newSandboxBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             int               `json:"timeout"`
	AutoPause           bool              `json:"autoPause"`
	Secure              bool              `json:"secure"`
	AllowInternetAccess bool              `json:"allow_internet_access"`
	Metadata            map[string]string `json:"metadata"`
}

// refuseMounts is the refusal of what a remote sandbox cannot have.
func refuseMounts(spec backends.SandboxSpec) error {
	if spec.HostWorkspace() {
		return boxerr.Validation("host_path", "the e2b backend runs sessions in remote E2B sandboxes, which cannot bind host directories: leave host_path empty (or mode none) and move files with the file API")
	}
	if len(spec.ActiveExtraMounts()) > 0 {
		return boxerr.Validation("extra_mounts", "the e2b backend runs sessions in remote E2B sandboxes, which cannot bind host directories: leave extra_mounts empty (skills are extra mounts too)")
	}
	if spec.Isolation != backends.IsolationDefault {
		return boxerr.Validation("isolation", "the e2b backend offers no isolation level beyond the endpoint's own, got %q", spec.Isolation)
	}
	return nil
}

// StartSession implements backends.Backend: a sandbox of the spec's
// image (the E2B template), whose metadata names this installation and
// the session.
func (b *Backend) StartSession(ctx context.Context, spec backends.SandboxSpec) (backends.Session, error) {
	if err := refuseMounts(spec); err != nil {
		return backends.Session{}, err
	}
	if err := spec.RefuseEgressPolicy(Name); err != nil {
		return backends.Session{}, err
	}
	template := spec.Image
	if template == "" {
		template = b.cfg.Template
	}
	box, err := json.Marshal(spec.Sandbox)
	if err != nil {
		return backends.Session{}, boxerr.Failure("e2b backend: %v", err).Wrap(err)
	}
	body := newSandboxBody{TemplateID: template, Timeout: int(b.timeout / time.Second), AutoPause: spec.Persistent, Secure: true,
		AllowInternetAccess: spec.Network == backends.NetworkOn,
		Metadata: map[string]string{metaInstance: b.cfg.InstanceID, metaSession: spec.SessionID, metaSandbox: string(box),
			metaMountPath: spec.MountPathOrDefault()}}
	var out sandboxJSON
	if err := b.control(ctx, http.MethodPost, "/sandboxes", body, &out); err != nil {
		return backends.Session{}, err
	}
	if err := out.check(); err != nil {
		return backends.Session{}, err
	}
	b.remember(out)
	info := spec.Session(Name, out.SandboxID)
	info.Image = template
	return info, nil
}

// Alive implements backends.Backend. Only an answer that the sandbox is
// gone or paused says no: an endpoint that cannot be reached does not
// make the runtime replace a session that may be fine.
func (b *Backend) Alive(ctx context.Context, info backends.Session) bool {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out sandboxJSON
	err := b.control(ctx, http.MethodGet, "/sandboxes/"+info.BackendSessionID, nil, &out)
	if errors.Is(err, boxerr.ErrSessionNotFound) {
		return false
	}
	return err != nil || out.State == "" || out.State == "running"
}

// StopSession implements backends.Backend: the sandbox is killed; one
// already gone is fine.
func (b *Backend) StopSession(ctx context.Context, info backends.Session) error {
	err := b.control(ctx, http.MethodDelete, "/sandboxes/"+info.BackendSessionID, nil, nil)
	b.forget(info.BackendSessionID)
	if errors.Is(err, boxerr.ErrSessionNotFound) {
		return nil
	}
	return err
}

// Suspend implements backends.Suspender: E2B's pause (processes end,
// files stay).
func (b *Backend) Suspend(ctx context.Context, info backends.Session) error {
	err := b.control(ctx, http.MethodPost, "/sandboxes/"+info.BackendSessionID+"/pause", nil, nil)
	b.forget(info.BackendSessionID)
	var be *boxerr.Error
	if errors.As(err, &be) && be.Details["http_status"] == http.StatusConflict {
		return nil // already paused
	}
	return err
}

// Resume implements backends.Suspender: E2B's connect, which resumes a
// paused sandbox (and answers its possibly new access token).
func (b *Backend) Resume(ctx context.Context, info backends.Session) error {
	var out sandboxJSON
	body := map[string]int{"timeout": int(b.timeout / time.Second)}
	if err := b.control(ctx, http.MethodPost, "/sandboxes/"+info.BackendSessionID+"/connect", body, &out); err != nil {
		return err
	}
	if out.SandboxID == "" {
		out.SandboxID = info.BackendSessionID
	}
	if err := out.check(); err != nil {
		return err
	}
	b.remember(out)
	return nil
}

// maxAdopted bounds one adoption listing.
const maxAdopted = 1000

// Adopt implements backends.Backend: the running and paused sandboxes
// whose metadata names this installation.
func (b *Backend) Adopt(ctx context.Context) ([]backends.Session, error) {
	list, err := b.own(ctx)
	if err != nil {
		return nil, err
	}
	var out []backends.Session
	var errs []error
	for _, s := range list {
		info, err := b.adopted(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if info.SessionID != "" {
			out = append(out, info)
		}
	}
	return out, errors.Join(errs...)
}

// Existing implements backends.Census: one listing for all sessions.
func (b *Backend) Existing(ctx context.Context) (map[string]bool, error) {
	list, err := b.own(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(list))
	for _, s := range list {
		if s.Metadata[metaInstance] == b.cfg.InstanceID && sandboxID().MatchString(s.SandboxID) {
			out[s.SandboxID] = true
		}
	}
	return out, nil
}

// own lists the running and paused sandboxes whose metadata names this
// installation (an endpoint that ignores the filter lists others too:
// callers check).
func (b *Backend) own(ctx context.Context) ([]sandboxJSON, error) {
	q := url.Values{"metadata": {url.Values{metaInstance: {b.cfg.InstanceID}}.Encode()}, "state": {"running,paused"},
		"limit": {fmt.Sprint(maxAdopted)}}
	var list []sandboxJSON
	if err := b.control(ctx, http.MethodGet, "/v2/sandboxes?"+q.Encode(), nil, &list); err != nil {
		return nil, err
	}
	if len(list) > maxAdopted {
		return nil, boxerr.Failure("e2b backend: the E2B API listed %d sandboxes, more than the %d asked for", len(list), maxAdopted)
	}
	return list, nil
}

// adopted is the session a listed sandbox holds; a sandbox of another
// installation (an endpoint that ignores the metadata filter) is skipped.
func (b *Backend) adopted(s sandboxJSON) (backends.Session, error) {
	if s.Metadata[metaInstance] != b.cfg.InstanceID {
		return backends.Session{}, nil
	}
	if !sandboxID().MatchString(s.SandboxID) || s.Metadata[metaSession] == "" || len(s.Metadata[metaSession]) > 1024 {
		return backends.Session{}, boxerr.Failure("e2b backend: sandbox %.80q has no valid session id in its metadata", s.SandboxID)
	}
	var box backends.Sandbox
	if err := json.Unmarshal([]byte(s.Metadata[metaSandbox]), &box); err != nil {
		return backends.Session{}, boxerr.Failure("e2b backend: sandbox %s has no valid sandbox spec in its metadata: %v", s.SandboxID, err)
	}
	spec := backends.SandboxSpec{SessionID: s.Metadata[metaSession], Sandbox: box}
	if err := refuseMounts(spec); err != nil {
		return backends.Session{}, err
	}
	info := spec.Session(Name, s.SandboxID)
	if s.State == "paused" {
		info.State = backends.StateSuspended
	}
	return info, nil
}
