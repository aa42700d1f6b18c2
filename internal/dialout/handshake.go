package dialout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/coder/websocket"
)

// Version is the handshake's version; a peer speaking another is refused.
const Version = 1

// Subprotocol is the WebSocket subprotocol a dialing runtime asks for.
const Subprotocol = "boxrt.dialout.v1"

// handshakeMax bounds a Hello or a Welcome.
const handshakeMax = 4 << 10

// Hello is the runtime's first message on every WebSocket it dials.
type Hello struct {
	Dialout int `json:"dialout"`
	// RuntimeID names the runtime (its instance id): the host keeps one
	// Client per runtime.
	RuntimeID string `json:"runtime_id"`
	// Version is boxrt's build version, for the host's logs.
	BoxrtVersion string `json:"version,omitempty"`
	// ConnID is the logical connection to resume, "" for a new one.
	ConnID string `json:"conn_id,omitempty"`
	// Received counts the frames of ConnID the runtime received.
	Received uint64 `json:"received"`
}

// Welcome is the host's answer to a Hello.
type Welcome struct {
	Dialout int    `json:"dialout"`
	ConnID  string `json:"conn_id"`
	// Resumed: ConnID is the Hello's, continued; false: a new logical
	// connection (the runtime ends the one it asked for).
	Resumed bool `json:"resumed"`
	// Received counts the frames of ConnID the host received.
	Received uint64 `json:"received"`
}

// IDPattern is what runtime and connection ids look like.
var IDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// Validate refuses a Hello that is not this version's or names bad ids.
func (h *Hello) Validate() error {
	if h.Dialout != Version {
		return fmt.Errorf("dial-out handshake version %d, want %d", h.Dialout, Version)
	}
	if !IDPattern.MatchString(h.RuntimeID) {
		return fmt.Errorf("runtime_id %q must match %s", h.RuntimeID, IDPattern)
	}
	if h.ConnID != "" && !IDPattern.MatchString(h.ConnID) {
		return fmt.Errorf("conn_id %q must match %s", h.ConnID, IDPattern)
	}
	return nil
}

func (w *Welcome) validate() error {
	if w.Dialout != Version {
		return fmt.Errorf("dial-out handshake version %d, want %d", w.Dialout, Version)
	}
	if !IDPattern.MatchString(w.ConnID) {
		return fmt.Errorf("conn_id %q must match %s", w.ConnID, IDPattern)
	}
	if !w.Resumed && w.Received != 0 {
		return errors.New("a new logical connection cannot have received frames")
	}
	return nil
}

// ReadHello reads and checks the runtime's Hello.
func ReadHello(ctx context.Context, ws *websocket.Conn) (Hello, error) {
	var h Hello
	if err := readJSON(ctx, ws, &h); err != nil {
		return h, err
	}
	return h, h.Validate()
}

// WriteWelcome sends the host's answer.
func WriteWelcome(ctx context.Context, ws *websocket.Conn, w Welcome) error {
	w.Dialout = Version
	return writeJSON(ctx, ws, w)
}

// Exchange sends h and reads the host's Welcome.
func Exchange(ctx context.Context, ws *websocket.Conn, h Hello) (Welcome, error) {
	h.Dialout = Version
	var w Welcome
	if err := writeJSON(ctx, ws, h); err != nil {
		return w, err
	}
	if err := readJSON(ctx, ws, &w); err != nil {
		return w, err
	}
	return w, w.validate()
}

func writeJSON(ctx context.Context, ws *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return ws.Write(ctx, websocket.MessageText, b)
}

func readJSON(ctx context.Context, ws *websocket.Conn, v any) error {
	typ, r, err := ws.Reader(ctx)
	if err != nil {
		return fmt.Errorf("reading the dial-out handshake: %w", err)
	}
	if typ != websocket.MessageText {
		return errors.New("the dial-out handshake must be a text message")
	}
	dec := json.NewDecoder(&limitedReader{r: r, n: handshakeMax})
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding the dial-out handshake: %w", err)
	}
	return nil
}

// limitedReader fails past n bytes instead of returning EOF, so an
// oversized handshake is an error, not a truncated one.
type limitedReader struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("the dial-out handshake exceeds %d bytes", handshakeMax)
	}
	p = p[:min(len(p), l.n)]
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}
