package actions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// EventNotification is the method of the notifications that carry a
// session event.
const EventNotification = "box_session_event"

// subscriptions are the open event subscriptions by id, each of the
// namespace it was made in.
type subscriptions struct {
	mu   sync.Mutex
	byID map[string]subscriptionEntry
}

type subscriptionEntry struct {
	scope string
	stop  context.CancelFunc
}

func (s *subscriptions) add(id, scope string, stop context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]subscriptionEntry{}
	}
	s.byID[id] = subscriptionEntry{scope: scope, stop: stop}
}

func (s *subscriptions) remove(id, scope string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if ok = ok && e.scope == scope; ok {
		e.stop()
		delete(s.byID, id)
	}
	return ok
}

type subscribeParams struct {
	SessionID string `json:"session_id"`
}

func (p *subscribeParams) validate() error {
	p.SessionID = strings.TrimSpace(p.SessionID)
	return nil
}

type subscribeResult struct {
	SubscriptionID string `json:"subscription_id"`
}

// subscribeEvents: box_subscribe_events {"session_id"?} →
// {"subscription_id"}; then box_session_event notifications on this
// connection (the session's, or every session's of the caller's
// namespace) until box_unsubscribe_events or the connection's end.
func (d *Dispatcher) subscribeEvents(ctx context.Context, p subscribeParams) (subscribeResult, error) {
	sub, err := d.rt.Events().Subscribe(ctx, p.SessionID)
	if err != nil {
		return subscribeResult{}, err
	}
	buf := make([]byte, 16)
	_, _ = rand.Read(buf)
	id := "sub-" + hex.EncodeToString(buf)
	scope := tenant.Scope(ctx)
	sctx, stop := context.WithCancel(rpc.ConnContext(ctx))
	d.subs.add(id, scope, stop)
	go func() {
		defer d.subs.remove(id, scope)
		defer sub.Close()
		forwardEvents(sctx, id, sub)
	}()
	return subscribeResult{SubscriptionID: id}, nil
}

// eventParams is box_session_event's params: the event, with the
// subscriber's session id and its subscription.
type eventParams struct {
	runtime.Event
	SubscriptionID string `json:"subscription_id"`
}

// forwardEvents notifies the subscription's events until ctx ends or the
// connection is gone.
func forwardEvents(ctx context.Context, id string, sub *runtime.Subscription) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-sub.C():
			ev.SessionID = tenant.Logical(ctx, ev.SessionID)
			if rpc.Notify(ctx, EventNotification, eventParams{Event: ev, SubscriptionID: id}) != nil {
				return
			}
		}
	}
}

type unsubscribeParams struct {
	SubscriptionID string `json:"subscription_id"`
}

// unsubscribeEvents: box_unsubscribe_events {"subscription_id"} → {}; an
// unknown id is a BoxValidationError on subscription_id.
func (d *Dispatcher) unsubscribeEvents(ctx context.Context, p unsubscribeParams) (struct{}, error) {
	if !d.subs.remove(p.SubscriptionID, tenant.Scope(ctx)) {
		return struct{}{}, boxerr.Validation("subscription_id", "no open subscription %q", p.SubscriptionID)
	}
	return struct{}{}, nil
}
