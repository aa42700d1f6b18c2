package runtime

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// PortDialer is a backend that can connect to a TCP port a session
// listens on at 127.0.0.1 inside its sandbox, whatever the session's
// network policy (box_expose_port).
type PortDialer interface {
	DialSessionPort(ctx context.Context, info backends.Session, port int) (net.Conn, error)
}

// Exposure bounds.
const (
	DefaultPortTTL = time.Hour
	MaxPortTTL     = 7 * 24 * time.Hour
	// MaxExposures bounds the exposed ports of one boxrt.
	MaxExposures = 1024
)

// Exposure is box_expose_port's result. Path is the URL path on boxrt's
// listener (PortPath); the caller puts its base in front.
type Exposure struct {
	SessionID string    `json:"session_id"`
	Port      int       `json:"port"`
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
	Path      string    `json:"-"`
}

// PortPath is the listener path that reaches port of the session with
// physical id: /v1/sessions/<id>/ports/<port>/.
func PortPath(physical string, port int) string {
	return "/v1/sessions/" + url.PathEscape(physical) + "/ports/" + strconv.Itoa(port) + "/"
}

type portKey struct {
	session string
	port    int
}

// Ports owns the exposed ports. A token is signed (HMAC-SHA256 under a key
// of this process) over the session, the port, its expiry and a nonce, and
// is valid while the nonce is the exposure's: a new box_expose_port of the
// same port, box_unexpose_port and the session's deletion revoke it.
// Exposures live in memory: a restarted boxrt has none.
type Ports struct {
	r   *Runtime
	key [32]byte
	mu  sync.Mutex
	// open maps an exposed port to its token's nonce and expiry.
	open map[portKey]exposure
}

type exposure struct {
	nonce   [16]byte
	expires time.Time
}

func newPorts(r *Runtime) *Ports {
	p := &Ports{r: r, open: map[portKey]exposure{}}
	_, _ = rand.Read(p.key[:])
	return p
}

// Ports is the exposed-ports service.
func (r *Runtime) Ports() *Ports { return r.ports }

// Expose opens port of session id to holders of the token it returns,
// for ttl (DefaultPortTTL when 0).
func (p *Ports) Expose(ctx context.Context, id string, port int, ttl time.Duration) (Exposure, error) {
	if port < 1 || port > 65535 {
		return Exposure{}, boxerr.Validation("port", "port must be between 1 and 65535, got %d", port)
	}
	if ttl == 0 {
		ttl = DefaultPortTTL
	}
	if ttl < time.Second || ttl > MaxPortTTL {
		return Exposure{}, boxerr.Validation("ttl_sec", "ttl_sec must be between 1 and %d, got %d", int(MaxPortTTL/time.Second), int(ttl/time.Second))
	}
	physical, err := resolve(ctx, id)
	if err != nil {
		return Exposure{}, err
	}
	if err := p.dialable(physical); err != nil {
		return Exposure{}, err
	}
	var e exposure
	_, _ = rand.Read(e.nonce[:])
	// Whole seconds (the token carries Unix seconds), rounded up: a token
	// never lives shorter than ttl.
	e.expires = p.r.clock.Now().Add(ttl + time.Second - time.Nanosecond).Truncate(time.Second)
	k := portKey{physical, port}
	p.mu.Lock()
	if _, ok := p.open[k]; !ok && len(p.open) >= MaxExposures {
		p.mu.Unlock()
		return Exposure{}, boxerr.CapacityExceeded("max_exposed_ports", MaxExposures, "%d ports are exposed (box_unexpose_port some)", MaxExposures)
	}
	p.open[k] = e
	p.mu.Unlock()
	p.r.events.publish(physical, EventPortExposed, map[string]any{"port": port, "expires_at": e.expires.UTC()})
	return Exposure{SessionID: physical, Port: port, Token: p.sign(k, e), ExpiresAt: e.expires.UTC(), Path: PortPath(physical, port)}, nil
}

// dialable checks that the session exists on a backend that can reach
// its ports.
func (p *Ports) dialable(physical string) error {
	if p.r.sessions.get(physical) == nil {
		return boxerr.SessionNotFound(physical)
	}
	b := p.r.backends.current()
	if _, ok := b.(PortDialer); !ok {
		name := "no"
		if b != nil {
			name = "the " + b.Name()
		}
		return boxerr.Failure("%s backend cannot reach a session's ports (bwrap and docker can)", name)
	}
	return nil
}

// Unexpose revokes port's token; false when it was not exposed.
func (p *Ports) Unexpose(ctx context.Context, id string, port int) (bool, error) {
	physical, err := resolve(ctx, id)
	if err != nil {
		return false, err
	}
	k := portKey{physical, port}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.open[k]
	delete(p.open, k)
	return ok, nil
}

// dropSession revokes every exposure of a destroyed session.
func (p *Ports) dropSession(physical string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.open {
		if k.session == physical {
			delete(p.open, k)
		}
	}
}

// ErrPortToken is Authorize's refusal: no token, a wrong one, an expired
// or a revoked one.
var ErrPortToken = errors.New("port token missing, invalid, expired or revoked")

const tokenPayload = 16 + 8

// sign is the token of exposure e of k: payload (nonce, expiry) and MAC,
// base64url.
func (p *Ports) sign(k portKey, e exposure) string {
	buf := make([]byte, tokenPayload, tokenPayload+sha256.Size)
	copy(buf, e.nonce[:])
	binary.BigEndian.PutUint64(buf[16:], uint64(e.expires.Unix()))
	return base64.RawURLEncoding.EncodeToString(append(buf, p.mac(k, buf)...))
}

func (p *Ports) mac(k portKey, payload []byte) []byte {
	m := hmac.New(sha256.New, p.key[:])
	m.Write([]byte(k.session))
	m.Write([]byte{0})
	m.Write([]byte(strconv.Itoa(k.port)))
	m.Write([]byte{0})
	m.Write(payload)
	return m.Sum(nil)
}

// Authorize checks token for port of the session with physical id: its
// signature, its expiry and that it is the exposure's current token.
func (p *Ports) Authorize(physical string, port int, token string) error {
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) != tokenPayload+sha256.Size {
		return ErrPortToken
	}
	k := portKey{physical, port}
	if !hmac.Equal(raw[tokenPayload:], p.mac(k, raw[:tokenPayload])) {
		return ErrPortToken
	}
	if p.r.clock.Now().Unix() >= int64(binary.BigEndian.Uint64(raw[16:tokenPayload])) {
		return ErrPortToken
	}
	p.mu.Lock()
	e, ok := p.open[k]
	p.mu.Unlock()
	if !ok || subtle.ConstantTimeCompare(e.nonce[:], raw[:16]) != 1 {
		return ErrPortToken
	}
	return nil
}

// Dial connects to port inside the session with physical id (authorized
// by Authorize), and marks the session used.
func (p *Ports) Dial(ctx context.Context, physical string, port int) (net.Conn, error) {
	s := p.r.sessions.get(physical)
	if s == nil {
		return nil, boxerr.SessionNotFound(physical)
	}
	info := p.r.sessions.info(s)
	if info.State == backends.StateSuspended {
		return nil, boxerr.Failure("session %s is suspended: nothing listens on port %d until it is resumed (box_resume_session) and the server started again", physical, port)
	}
	if err := p.dialable(physical); err != nil {
		return nil, err
	}
	p.r.sessions.touch(physical)
	return p.r.backends.current().(PortDialer).DialSessionPort(ctx, info, port)
}
