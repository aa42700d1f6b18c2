package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Bounds of the control API.
const (
	// maxControlBody bounds a control answer (a listing of maxAdopted
	// sandboxes with their metadata fits).
	maxControlBody = 8 << 20
	// controlTimeout bounds one control call without a deadline of its own
	// (a create on a busy endpoint takes seconds).
	controlTimeout = 2 * time.Minute
	// maxMessageText bounds the endpoint's words quoted in an error.
	maxMessageText = 512
)

// control sends one control API call: body (when not nil) as JSON, out
// (when not nil) decoded from a 2xx answer. A refusal is a typed error
// carrying the endpoint's status and (bounded) message.
func (b *Backend) control(ctx context.Context, method, path string, body, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, controlTimeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		buf, err := json.Marshal(body)
		if err != nil {
			return boxerr.Failure("e2b backend: %v", err).Wrap(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.api.String()+path, rd)
	if err != nil {
		return boxerr.Failure("e2b backend: %v", err).Wrap(err)
	}
	req.Header.Set("X-API-Key", b.cfg.APIKey)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return boxerr.BackendUnavailable("e2b backend: the E2B API at %s cannot be reached: %v", b.api.Host, err).Wrap(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxControlBody+1))
	if err != nil {
		return boxerr.BackendUnavailable("e2b backend: reading the E2B API's answer to %s %s: %v", method, pathOnly(path), err).Wrap(err)
	}
	if len(data) > maxControlBody {
		return boxerr.Failure("e2b backend: the E2B API's answer to %s %s is over %d bytes", method, pathOnly(path), maxControlBody)
	}
	if resp.StatusCode/100 != 2 {
		return controlError(method, path, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return boxerr.Failure("e2b backend: the E2B API's answer to %s %s is not the JSON expected: %v", method, pathOnly(path), err).Wrap(err)
	}
	return nil
}

func pathOnly(p string) string {
	p, _, _ = strings.Cut(p, "?")
	return p
}

// controlError is a refused control call as boxrt's typed error: the
// status decides the kind (401/403: the key; 404: the sandbox or
// template; 429: the endpoint's capacity).
func controlError(method, path string, status int, body []byte) error {
	var e struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(body, &e)
	msg := quote(e.Message)
	if msg == "" {
		msg = http.StatusText(status)
	}
	what := fmt.Sprintf("e2b backend: %s %s: the E2B API answered %d: %s", method, pathOnly(path), status, msg)
	var err *boxerr.Error
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		err = boxerr.BackendUnavailable("%s (check e2b.api_key)", what)
	case status == http.StatusNotFound && strings.HasPrefix(path, "/sandboxes/"):
		id, _, _ := strings.Cut(strings.TrimPrefix(path, "/sandboxes/"), "/")
		err = boxerr.SessionNotFound(id)
		err.Msg = what
	case status == http.StatusNotFound:
		err = boxerr.Validation("image", "%s (the image names an E2B template; check e2b.template)", what)
	case status == http.StatusBadRequest:
		err = boxerr.Validation("spec", "%s", what)
	case status == http.StatusTooManyRequests:
		err = boxerr.CapacityExceeded("e2b", status, "%s (the endpoint's sandbox or rate limit)", what)
	default:
		err = boxerr.Failure("%s", what)
		err.Retryable = status >= 500
	}
	return err.With("http_status", status)
}

// quote is text from the endpoint made safe to put in an error: valid
// UTF-8, no control characters, bounded.
func quote(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > maxMessageText {
		s = s[:maxMessageText]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return strings.TrimSpace(s)
}

// touch extends the sandbox's E2B timeout once half of it has passed, so
// a session in use outlives it and an abandoned one does not.
func (b *Backend) touch(ctx context.Context, sb *sandbox) {
	now := time.Now()
	sb.mu.Lock()
	due := now.Sub(sb.extended) > b.timeout/2
	if due {
		sb.extended = now
	}
	sb.mu.Unlock()
	if !due {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	body := map[string]int{"timeout": int(b.timeout / time.Second)}
	if err := b.control(ctx, http.MethodPost, "/sandboxes/"+sb.id+"/timeout", body, nil); err != nil {
		// The next use tries again.
		sb.mu.Lock()
		sb.extended = time.Time{}
		sb.mu.Unlock()
	}
}

// errGone says a sandbox's envd is not there (E2B's proxy answers 502).
var errGone = errors.New("the E2B sandbox is not running")
