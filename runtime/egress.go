package runtime

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// egressHub is the runtime's side of the egress proxy (internal/egress):
// the one proxy every session with network goes out through (the backends
// attach their sessions' namespaces to it, tagged with the session's
// physical id), and the denials it reports, fanned out to whoever watches
// a session's network (a box_exec's caller).
type egressHub struct {
	proxy   *egress.Proxy
	records *egressRecords

	mu       sync.Mutex
	watchers map[string]map[chan egress.Denial]struct{}
}

// denialBuffer bounds the denials waiting for one watcher; more are
// dropped (the counters in box_get_session still count them).
const denialBuffer = 64

func newEgressHub(cfg Egress, stateDir string, secretsFile func() string, log zerolog.Logger) (*egressHub, error) {
	h := &egressHub{watchers: map[string]map[chan egress.Denial]struct{}{},
		records: loadEgressRecords(filepath.Join(stateDir, "network"), secretsFile, log)}
	roots, err := cfg.upstreamRoots()
	if err != nil {
		return nil, err
	}
	p, err := egress.New(egress.Config{Hosts: cfg.Hosts, UpstreamRoots: roots, OnDenied: h.denied,
		Restore: h.records.restore, Log: log})
	if err != nil {
		return nil, err
	}
	h.proxy = p
	return h, nil
}

// denied runs on the proxy's connection goroutine: it never blocks.
func (h *egressHub) denied(d egress.Denial) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.watchers[d.Session] {
		select {
		case ch <- d:
		default:
		}
	}
}

func (h *egressHub) watch(id string) (chan egress.Denial, func()) {
	ch := make(chan egress.Denial, denialBuffer)
	h.mu.Lock()
	if h.watchers[id] == nil {
		h.watchers[id] = map[chan egress.Denial]struct{}{}
	}
	h.watchers[id][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.watchers[id], ch)
		if len(h.watchers[id]) == 0 {
			delete(h.watchers, id)
		}
		h.mu.Unlock()
	}
}

// NetworkEvent is one connection or DNS question the egress proxy refused
// (box_network_event). Port is 0 for DNS.
type NetworkEvent struct {
	Name   string `json:"name,omitempty"`
	Addr   string `json:"addr,omitempty"`
	Port   uint16 `json:"port"`
	Reason string `json:"reason"`
}

// WatchNetwork calls send with each denial of the session's network until
// stop is called; stop returns once send is no longer running. send may
// block (a slow peer): denials beyond a small buffer are dropped meanwhile.
func (r *Runtime) WatchNetwork(ctx context.Context, sessionID string, send func(NetworkEvent)) (stop func()) {
	physical, err := resolve(ctx, sessionID)
	if err != nil {
		return func() {}
	}
	ch, unwatch := r.egress.watch(physical)
	done := make(chan struct{})
	quit := make(chan struct{})
	forward := func(d egress.Denial) {
		ev := NetworkEvent{Name: d.Name, Port: d.Port, Reason: d.Reason}
		if d.Addr.IsValid() {
			ev.Addr = d.Addr.String()
		}
		send(ev)
	}
	go func() {
		defer close(done)
		for {
			select {
			case d := <-ch:
				forward(d)
			case <-quit:
				// What was refused before the stop is still sent.
				for {
					select {
					case d := <-ch:
						forward(d)
					default:
						return
					}
				}
			}
		}
	}()
	return func() {
		unwatch()
		close(quit)
		<-done
	}
}

// NetworkStatus is a session's network in box_get_session: the policy in
// force and the proxy's counters (absent while no sandbox of the session
// is attached, e.g. suspended).
type NetworkStatus struct {
	Policy   backends.NetworkMode `json:"policy"`
	Attached bool                 `json:"attached"`
	*egress.Stats
}

// networkStatus is the session's NetworkStatus, nil for network off.
func (r *Runtime) networkStatus(physical string, info backends.Session) *NetworkStatus {
	if !info.Network.Egress() {
		return nil
	}
	st := &NetworkStatus{Policy: info.Network}
	if es := r.egress.proxy.Session(physical); es != nil {
		stats := es.Stats()
		st.Attached, st.Stats = true, &stats
	}
	return st
}

// UpdateNetwork changes a running session's policy: new connections
// follow it at once, and open ones it denies are closed. A session made
// with network off has no namespace to change; "off" on a session with
// network denies everything (it is kept as {"allow": []}, so the session
// keeps its namespace and can be opened again).
func (r *Runtime) UpdateNetwork(ctx context.Context, sessionID string, network backends.NetworkMode) (*NetworkStatus, error) {
	physical, err := resolve(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	canon, err := backends.CanonicalNetwork(network, "network")
	if err != nil {
		return nil, err
	}
	if canon == backends.NetworkOff {
		canon = `{"allow":[]}`
	}
	pol, _ := canon.Policy("network")
	var out *NetworkStatus
	err = r.sessions.underLive(physical, func(s *session) error {
		r.sessions.mu.Lock()
		if !s.info.Network.Egress() {
			r.sessions.mu.Unlock()
			return boxerr.Validation("network", "session %s was created with network \"off\": it has no network to change; create it with \"on\" or a policy (e.g. {\"allow\": []}) to change it later", sessionID)
		}
		info := s.info
		info.Network = canon
		r.sessions.mu.Unlock()
		if err := r.egress.records.update(info, func(rec *egressRecord) { rec.Network = canon }); err != nil {
			return boxerr.Failure("cannot record session %s's new network in the state directory, so it was not changed: %v", sessionID, err).Wrap(err)
		}
		r.sessions.mu.Lock()
		s.info.Network = canon
		r.sessions.mu.Unlock()
		if es := r.egress.proxy.Session(physical); es != nil {
			es.Update(pol)
		}
		out = r.networkStatus(physical, info)
		return nil
	})
	return out, err
}

// recordSecrets keeps a new persistent session's secrets and their
// identity for a boxrt restarted on the same state directory (the
// sandbox's processes keep their placeholders, its bundle the CA). A
// session with none, or one that cannot outlive boxrt, records nothing.
func (r *Runtime) recordSecrets(info backends.Session, params []SecretParam) error {
	if len(params) == 0 || !info.Persistent {
		return nil
	}
	es := r.egress.proxy.Session(info.SessionID)
	if es == nil {
		return nil // not attached: a restart gives it new placeholders, as a resume does
	}
	id, err := es.Identity()
	if err != nil {
		return err
	}
	return r.egress.records.update(info, func(rec *egressRecord) { rec.Secrets, rec.Identity = params, id })
}

// EgressTotals are the proxy's counters over all sessions (/metrics).
func (r *Runtime) EgressTotals() egress.Totals { return r.egress.proxy.Totals() }

// resolveSecrets turns the spec's secrets into the backend's: values as
// sent, refs read from the operator's secret store. No error names a
// value.
func resolveSecrets(params []SecretParam, storeFile string) ([]egress.Secret, error) {
	if len(params) == 0 {
		return nil, nil
	}
	var store map[string]string
	out := make([]egress.Secret, len(params))
	for i, p := range params {
		out[i] = egress.Secret{Name: p.Name, Value: p.Value, Hosts: p.Hosts, Query: p.Query}
		if p.Ref == "" {
			continue
		}
		if store == nil {
			var err error
			if store, err = readSecretStore(storeFile); err != nil {
				return nil, err
			}
		}
		v, ok := store[p.Ref]
		if !ok {
			return nil, boxerr.Validation(fmt.Sprintf("secrets[%d].ref", i), "secrets[%d].ref: the secret store has no entry %q", i, p.Ref)
		}
		out[i].Value = v
	}
	return out, egress.ValidateSecrets(out, "secrets")
}

// upstreamRoots are the host's roots plus egress.upstream_ca_file's
// certificates; nil (the host's roots) without the file.
func (e Egress) upstreamRoots() (*x509.CertPool, error) {
	if e.UpstreamCAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(e.UpstreamCAFile)
	if err != nil {
		return nil, boxerr.Validation("egress.upstream_ca_file", "egress.upstream_ca_file: %v", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, boxerr.Validation("egress.upstream_ca_file", "egress.upstream_ca_file %s holds no PEM certificate", e.UpstreamCAFile)
	}
	return pool, nil
}

// readSecretStore reads egress.secrets_file, a JSON object name → value.
func readSecretStore(path string) (map[string]string, error) {
	if path == "" {
		return nil, boxerr.Validation("secrets", "a secret names a ref but the operator configured no egress.secrets_file: send the value, or ask the operator for a secret store")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, boxerr.Failure("egress.secrets_file: cannot read the secret store: %v", err).Wrap(err)
	}
	var store map[string]string
	if err := json.Unmarshal(data, &store); err != nil {
		// Not err: a decoding error may quote the file's contents.
		return nil, boxerr.Failure("egress.secrets_file %s is not a JSON object of name → value", path)
	}
	return store, nil
}
