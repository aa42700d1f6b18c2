package runtime

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// EventsConfig is the operator's webhook for session events.
type EventsConfig struct {
	// WebhookURL receives a POST of every event's JSON (http or https);
	// "" sends none.
	WebhookURL string `json:"webhook_url"`
	// WebhookSecret keys the HMAC-SHA256 signature of each body
	// (WebhookSignatureHeader); "" sends posts unsigned.
	WebhookSecret string `json:"webhook_secret"`
}

func (c EventsConfig) validate() error {
	if c.WebhookURL == "" {
		return nil
	}
	u, err := url.Parse(c.WebhookURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return boxerr.Validation("events.webhook_url", "events.webhook_url must be an http:// or https:// URL, got %q", c.WebhookURL)
	}
	return nil
}

// The webhook's wire: the body is the event's JSON (as box_session_event's
// params); WebhookSignatureHeader is "sha256=" and the lowercase hex
// HMAC-SHA256 of the body under events.webhook_secret.
const (
	WebhookSignatureHeader = "X-Boxrt-Signature"
	WebhookEventHeader     = "X-Boxrt-Event"
)

// Webhook delivery bounds.
const (
	// WebhookQueue is how many events wait for the webhook; more are
	// dropped and counted (a slow receiver never grows boxrt's memory).
	WebhookQueue    = 1024
	webhookAttempts = 5
	webhookTimeout  = 10 * time.Second
	webhookBackoff  = 250 * time.Millisecond
	webhookMaxWait  = 5 * time.Second
)

// EventStats is box_status's view of the events: what subscribers lost
// to full queues, and the webhook's deliveries.
type EventStats struct {
	Dropped int64        `json:"subscriber_dropped"`
	Webhook WebhookStats `json:"webhook"`
}

// WebhookStats counts the webhook's deliveries.
type WebhookStats struct {
	Delivered int64 `json:"delivered"`
	Failed    int64 `json:"failed"`
	Dropped   int64 `json:"dropped"`
}

// webhook posts events to the operator's URL from one goroutine.
type webhook struct {
	r      *Runtime
	client *http.Client
	sub    *Subscription
	stats  struct{ delivered, failed atomic.Int64 }
}

// Sign is the WebhookSignatureHeader value of body under secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// newWebhook subscribes to every session's events, while a webhook URL is
// configured (filtered at publish, so nothing queues without one).
func newWebhook(r *Runtime) *webhook {
	w := &webhook{r: r, client: &http.Client{Timeout: webhookTimeout}}
	w.sub, _ = r.events.subscribe(func(string) bool { return r.Config().Events.WebhookURL != "" }, WebhookQueue)
	return w
}

// loop delivers events until ctx ends.
func (w *webhook) loop(ctx context.Context) {
	defer w.sub.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-w.sub.C():
			w.deliver(ctx, ev)
		}
	}
}

// deliver posts ev, retrying with backoff on a transport error or a
// non-2xx answer.
func (w *webhook) deliver(ctx context.Context, ev Event) {
	body, err := json.Marshal(ev)
	if err != nil {
		return
	}
	wait := webhookBackoff
	for attempt := 1; ; attempt++ {
		cfg := w.r.Config().Events
		if cfg.WebhookURL == "" {
			return
		}
		err := w.post(ctx, cfg, ev.Type, body)
		if err == nil {
			w.stats.delivered.Add(1)
			return
		}
		if attempt == webhookAttempts {
			w.stats.failed.Add(1)
			w.r.log.Warn().Err(err).Str("session_id", ev.SessionID).Str("type", ev.Type).Msg("webhook: event not delivered")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, webhookMaxWait)
	}
}

func (w *webhook) post(ctx context.Context, cfg EventsConfig, typ string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(WebhookEventHeader, typ)
	if cfg.WebhookSecret != "" {
		req.Header.Set(WebhookSignatureHeader, Sign(cfg.WebhookSecret, body))
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return boxerr.Failure("webhook answered %s", resp.Status)
	}
	return nil
}

// WebhookStats reports the webhook's deliveries.
func (r *Runtime) WebhookStats() WebhookStats {
	return WebhookStats{Delivered: r.webhook.stats.delivered.Load(), Failed: r.webhook.stats.failed.Load(),
		Dropped: r.webhook.sub.Dropped()}
}
