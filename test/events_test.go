package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/runtime"
)

type sessionEvent struct {
	SessionID      string         `json:"session_id"`
	Type           string         `json:"type"`
	At             time.Time      `json:"at"`
	Details        map[string]any `json:"details"`
	SubscriptionID string         `json:"subscription_id"`
}

// nextEvent reads stdout until a box_session_event notification.
func nextSessionEvent(t *testing.T, p *Proc, timeout time.Duration) sessionEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		line := p.NextLine(time.Until(deadline))
		var msg struct {
			Method string       `json:"method"`
			Params sessionEvent `json:"params"`
		}
		if json.Unmarshal(line, &msg) == nil && msg.Method == "box_session_event" {
			return msg.Params
		}
	}
}

// webhookSink is a loopback receiver that keeps the posts whose signature
// checks out under secret, and counts the others.
type webhookSink struct {
	srv    *httptest.Server
	mu     sync.Mutex
	events []sessionEvent
	bad    int
}

func newWebhookSink(t *testing.T, secret string) *webhookSink {
	s := &webhookSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev sessionEvent
		ok := r.Method == http.MethodPost && r.Header.Get("X-Boxrt-Signature") == runtime.Sign(secret, body) &&
			json.Unmarshal(body, &ev) == nil && r.Header.Get("X-Boxrt-Event") == ev.Type
		s.mu.Lock()
		if ok {
			s.events = append(s.events, ev)
		} else {
			s.bad++
		}
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *webhookSink) types(session string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, ev := range s.events {
		if ev.SessionID == session {
			out = append(out, ev.Type)
		}
	}
	return out
}

func TestSessionEvents(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			sink := newWebhookSink(t, "s3cret")
			cfg := fmt.Sprintf(`{%s,"events":{"webhook_url":%q,"webhook_secret":"s3cret"}}`, portBackends[backend], sink.srv.URL)
			p := Start(t, Options{Stdio: true, Config: cfg})
			var sub struct {
				SubscriptionID string `json:"subscription_id"`
			}
			p.MustCall("box_subscribe_events", map[string]any{}, &sub)
			require.NotEmpty(t, sub.SubscriptionID)

			const sid = "ev"
			spec := map[string]any{"session_id": sid, "persistent": true, "memory_mb": 128}
			if backend == "docker" {
				spec["read_only_rootfs"] = false
			}
			p.MustCall("box_create_session", spec, nil)
			t.Cleanup(func() { p.Call("box_delete_session", map[string]any{"session_id": sid}, time.Minute) })
			var res struct {
				Status   string `json:"status"`
				ExitCode *int   `json:"exit_code"`
				Stderr   string `json:"stderr"`
			}
			exec := func(cmd string, timeout int) {
				params := map[string]any{"cmd": cmd, "timeout_sec": timeout}
				for k, v := range spec {
					params[k] = v
				}
				p.MustCall("box_exec", params, &res)
			}
			exec("sleep 30", 1)
			require.Equal(t, "timed_out", res.Status)
			exec(`python3 -c "b = b'x' * (400 << 20); print(len(b))"`, 60)
			require.NotNil(t, res.ExitCode)
			require.Equal(t, 137, *res.ExitCode, "the memory limit kills it: %s", res.Stderr)
			p.MustCall("box_suspend_session", map[string]any{"session_id": sid}, nil)
			p.MustCall("box_resume_session", map[string]any{"session_id": sid}, nil)
			p.MustCall("box_delete_session", map[string]any{"session_id": sid}, nil)

			want := []string{"created", "exec_timed_out", "oom_killed", "suspended", "resumed", "deleted"}
			var got []string
			for len(got) < len(want) {
				ev := nextSessionEvent(t, p, time.Minute)
				assert.Equal(t, sid, ev.SessionID)
				assert.Equal(t, sub.SubscriptionID, ev.SubscriptionID)
				assert.WithinDuration(t, time.Now(), ev.At, time.Minute)
				assert.NotNil(t, ev.Details)
				got = append(got, ev.Type)
			}
			assert.Equal(t, want, got)

			require.Eventually(t, func() bool { return len(sink.types(sid)) >= len(want) }, 30*time.Second, 50*time.Millisecond)
			assert.Equal(t, want, sink.types(sid), "the webhook gets the same events, signed")
			assert.Zero(t, sink.bad)

			p.MustCall("box_unsubscribe_events", map[string]any{"subscription_id": sub.SubscriptionID}, nil)
			r := p.Call("box_unsubscribe_events", map[string]any{"subscription_id": sub.SubscriptionID}, time.Minute)
			require.NotNil(t, r.Error)
			assert.Equal(t, "subscription_id", r.Error.Data["field"])
		})
	}
}

// TestSessionEventsOneSession: a subscription to one session hears only
// that session's events.
func TestSessionEventsOneSession(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: bwrapConfig})
	p.MustCall("box_create_session", map[string]any{"session_id": "a"}, nil)
	var sub struct {
		SubscriptionID string `json:"subscription_id"`
	}
	p.MustCall("box_subscribe_events", map[string]any{"session_id": "a"}, &sub)
	p.MustCall("box_create_session", map[string]any{"session_id": "b"}, nil)
	p.MustCall("box_delete_session", map[string]any{"session_id": "b"}, nil)
	p.MustCall("box_delete_session", map[string]any{"session_id": "a"}, nil)
	ev := nextSessionEvent(t, p, 30*time.Second)
	assert.Equal(t, "a", ev.SessionID)
	assert.Equal(t, "deleted", ev.Type)
	assert.Equal(t, "delete", ev.Details["reason"])
}

// TestWebhookSlowReceiver: a receiver that never answers costs boxrt a
// bounded queue, not memory per event; what does not fit is dropped and
// counted.
func TestWebhookSlowReceiver(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	p := Start(t, Options{Stdio: true, Config: fmt.Sprintf(`{"backend":"bwrap","events":{"webhook_url":%q}}`, srv.URL)})
	p.MustCall("box_create_session", map[string]any{"session_id": "w"}, nil)
	t.Cleanup(func() { p.Call("box_delete_session", map[string]any{"session_id": "w"}, time.Minute) })
	burst := func(n int) {
		for i := 0; i < n; i++ {
			p.MustCall("box_expose_port", map[string]any{"session_id": "w", "port": 8000 + i%100}, nil)
		}
	}
	burst(runtime.WebhookQueue + 500)
	before := rssOf(t, p.cmd.Process.Pid)
	burst(20000)
	after := rssOf(t, p.cmd.Process.Pid)
	var st struct {
		Events struct {
			Webhook struct {
				Dropped, Delivered int64
			} `json:"webhook"`
		} `json:"events"`
	}
	p.MustCall("box_status", map[string]any{}, &st)
	assert.GreaterOrEqual(t, st.Events.Webhook.Dropped, int64(20000), "%+v", st)
	assert.Less(t, after-before, int64(32<<20), "RSS grew from %d to %d KiB over 20,000 undeliverable events", before>>10, after>>10)
}

// rssOf is a process's resident memory in bytes.
func rssOf(t *testing.T, pid int) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
