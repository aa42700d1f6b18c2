package sandboxagent

import (
	"bytes"
	"sync"
)

// streamQueue holds one process's data between a frame reader, which must
// never block on a slow consumer, and the goroutine that passes it on.
// The window (streamWindow) bounds it: the reader checks a frame against
// the window before it puts the frame's data here.
type streamQueue struct {
	mu    sync.Mutex
	bufs  [2]bytes.Buffer // by stream: stdout and stderr, or stdin alone
	end   bool            // nothing more will come
	ready chan struct{}   // a token when something changed
}

func newStreamQueue() *streamQueue { return &streamQueue{ready: make(chan struct{}, 1)} }

func (q *streamQueue) put(stream int, data []byte) {
	q.mu.Lock()
	q.bufs[stream].Write(data)
	q.mu.Unlock()
	q.wake()
}

// close says that nothing more will come; what is queued is still taken.
func (q *streamQueue) close() {
	q.mu.Lock()
	q.end = true
	q.mu.Unlock()
	q.wake()
}

func (q *streamQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take waits for data or the end and returns all that is queued; end is
// true once the queue is closed and empty.
func (q *streamQueue) take() (data [2][]byte, end bool) {
	for {
		q.mu.Lock()
		for i := range q.bufs {
			if q.bufs[i].Len() > 0 {
				data[i] = bytes.Clone(q.bufs[i].Bytes())
				q.bufs[i].Reset()
			}
		}
		end = q.end && data[0] == nil && data[1] == nil
		q.mu.Unlock()
		if end || data[0] != nil || data[1] != nil {
			return data, end
		}
		<-q.ready
	}
}
