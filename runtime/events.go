package runtime

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// The types of session events (box_session_event).
const (
	EventCreated       = "created"
	EventSuspended     = "suspended"
	EventResumed       = "resumed"
	EventRestarted     = "restarted"
	EventDeleted       = "deleted"
	EventReaped        = "reaped"
	EventOOMKilled     = "oom_killed"
	EventExecTimedOut  = "exec_timed_out"
	EventProcessExited = "process_exited"
	EventPortExposed   = "port_exposed"
)

// Event is one thing that happened to a session. SessionID is the
// physical id; a subscriber in a Workspace sees it as its logical id.
type Event struct {
	SessionID string         `json:"session_id"`
	Type      string         `json:"type"`
	At        time.Time      `json:"at"`
	Details   map[string]any `json:"details"`
}

// Subscriber bounds.
const (
	// SubscriberQueue is how many events wait for one subscriber; more are
	// dropped (and counted) rather than slowing the runtime down.
	SubscriberQueue = 256
	// MaxSubscribers bounds the subscriptions of one boxrt.
	MaxSubscribers = 256
)

// Events owns the subscribers to session events. Publishing never blocks:
// a subscriber whose queue is full loses the event, which is counted.
type Events struct {
	clock   Clock
	mu      sync.Mutex
	subs    map[*Subscription]struct{}
	dropped atomic.Int64
}

// Subscription is one subscriber's queue.
type Subscription struct {
	events  *Events
	match   func(physical string) bool
	c       chan Event
	dropped atomic.Int64
	once    sync.Once
}

// Subscribe starts a subscription to the events of session id (every
// session of ctx's namespace when id is ""). The caller must Close it.
func (e *Events) Subscribe(ctx context.Context, id string) (*Subscription, error) {
	var match func(string) bool
	if id != "" {
		physical, err := resolve(ctx, id)
		if err != nil {
			return nil, err
		}
		match = func(s string) bool { return s == physical }
	} else {
		scope := context.WithoutCancel(ctx)
		match = func(s string) bool { return tenant.Visible(scope, s) }
	}
	return e.subscribe(match, SubscriberQueue)
}

func (e *Events) subscribe(match func(string) bool, queue int) (*Subscription, error) {
	s := &Subscription{events: e, match: match, c: make(chan Event, queue)}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.subs) >= MaxSubscribers {
		return nil, boxerr.CapacityExceeded("max_event_subscribers", MaxSubscribers,
			"%d event subscriptions are open (box_unsubscribe_events some)", MaxSubscribers)
	}
	if e.subs == nil {
		e.subs = map[*Subscription]struct{}{}
	}
	e.subs[s] = struct{}{}
	return s, nil
}

// C delivers the events.
func (s *Subscription) C() <-chan Event { return s.c }

// Dropped is how many events this subscriber lost to a full queue.
func (s *Subscription) Dropped() int64 { return s.dropped.Load() }

// Close ends the subscription; C is not closed (a publish may race it).
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.events.mu.Lock()
		delete(s.events.subs, s)
		s.events.mu.Unlock()
	})
}

// Dropped is how many events all subscribers lost to full queues.
func (e *Events) Dropped() int64 { return e.dropped.Load() }

// publish hands an event to every subscriber that wants it.
func (e *Events) publish(sessionID, typ string, details map[string]any) {
	if details == nil {
		details = map[string]any{}
	}
	ev := Event{SessionID: sessionID, Type: typ, At: e.clock.Now().UTC(), Details: details}
	e.mu.Lock()
	defer e.mu.Unlock()
	for s := range e.subs {
		if !s.match(sessionID) {
			continue
		}
		select {
		case s.c <- ev:
		default:
			s.dropped.Add(1)
			e.dropped.Add(1)
		}
	}
}

// Events is the session event hub (box_subscribe_events, the webhook).
func (r *Runtime) Events() *Events { return r.events }

// publishDestroyed reports a session's end: reaped by the TTL, or deleted
// (the reason says by what: delete, recreate, shutdown, exit).
func (r *Runtime) publishDestroyed(physical, reason string) {
	if reason == reasonTTL {
		r.events.publish(physical, EventReaped, map[string]any{"reason": reason})
		return
	}
	r.events.publish(physical, EventDeleted, map[string]any{"reason": reason})
}

// publishExec reports what an exec's status says happened to the session.
func (r *Runtime) publishExec(physical string, spec Spec, status backends.ExitStatus) {
	if status.Restarted {
		r.events.publish(physical, EventRestarted, map[string]any{"reason": "sandbox lost"})
	}
	if status.OOMKilled {
		r.events.publish(physical, EventOOMKilled, map[string]any{"exit_code": status.ExitCode})
	}
	if status.TimedOut {
		r.events.publish(physical, EventExecTimedOut, map[string]any{"timeout_sec": spec.TimeoutSec})
	}
}
