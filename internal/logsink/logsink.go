package logsink

import (
	"bytes"
	"io"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

const (
	// logRingLines bounds the log lines waiting for stderr. A host that
	// reads stderr drains them far faster than boxrt writes them; one that
	// stops reading costs at most this many lines of memory (plus the
	// pipe's own buffer) and loses the rest, counted.
	logRingLines = 1024
	// stdlogQueue bounds lines of the standard library's log package
	// (net/http's server errors, client-go through klog) waiting to be
	// turned into zerolog lines.
	stdlogQueue = 256
)

// Sink is where boxrt's logs go: stderr (or any writer) behind a
// bounded ring, so that logging never blocks request handling. A host that
// pipes stderr and never reads it fills the pipe; before the ring, the
// next log write blocked whichever goroutine was answering a request, and
// the protocol stalled. Now a full ring drops its oldest line, the count
// goes to Dropped (exported as boxrt_log_dropped_lines_total), and once
// stderr drains again one warning line says how many were lost.
//
// The ring's writer goroutine sleeps until a line arrives: an idle boxrt
// does not wake up to look for log lines (zerolog's diode writer, used
// before, polled every 10 ms, which was most of an idle boxrt's CPU).
type Sink struct {
	w       io.Writer
	direct  zerolog.Logger // the drop report, written straight to w
	mu      sync.Mutex
	ring    [logRingLines][]byte
	head, n int           // the oldest line and how many wait, under mu
	wake    chan struct{} // a line arrived; capacity 1, so a wake-up is never lost
	stop    chan struct{} // Close: write out what waits, then end
	dropped atomic.Uint64

	stdlogDropped atomic.Uint64
	stdlog        chan string
	stdlogStop    chan struct{}
	stdlogDone    chan struct{}
	stdlogPrev    io.Writer
	stdlogFlag    int
	closeOnce     sync.Once
	closed        chan struct{}
}

// New returns a sink writing to w in the given format ("json" or
// "console", checked by the caller) and a logger at lvl on top of it.
func New(w io.Writer, format string, lvl zerolog.Level) (*Sink, zerolog.Logger) {
	s := &Sink{w: w, wake: make(chan struct{}, 1), stop: make(chan struct{}), closed: make(chan struct{})}
	color := terminal(w)
	s.direct = zerolog.New(formatted(w, format, color)).Level(lvl).With().Timestamp().Logger()
	go s.drain()
	// zerolog (and its console writer) writes one event per Write call.
	return s, zerolog.New(formatted(ringWriter{s}, format, color)).Level(lvl).With().Timestamp().Logger()
}

// formatted is w in format; the console format colours its lines only
// when color says w is a terminal (stderr redirected to a file or a pipe
// gets plain text, without escape codes).
func formatted(w io.Writer, format string, color bool) io.Writer {
	if format == "console" {
		return zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339, NoColor: !color}
	}
	return w
}

// terminal reports whether w is a file open on a terminal.
func terminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// ringWriter hands each Write (one log line) to the sink's ring.
type ringWriter struct{ s *Sink }

func (r ringWriter) Write(p []byte) (int, error) {
	r.s.push(bytes.Clone(p)) // zerolog reuses p once Write returns
	return len(p), nil
}

// push queues a line, dropping the oldest one when the ring is full, and
// wakes the writer goroutine. It never waits for stderr.
func (s *Sink) push(line []byte) {
	s.mu.Lock()
	if s.n == len(s.ring) {
		s.ring[s.head] = nil
		s.head = (s.head + 1) % len(s.ring)
		s.n--
		s.dropped.Add(1)
	}
	s.ring[(s.head+s.n)%len(s.ring)] = line
	s.n++
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// pop takes the oldest line; ok is false when none waits.
func (s *Sink) pop() (line []byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return nil, false
	}
	line = s.ring[s.head]
	s.ring[s.head] = nil
	s.head = (s.head + 1) % len(s.ring)
	s.n--
	return line, true
}

// drain writes lines out as they arrive, one at a time, so that at most
// one line beyond the ring waits in a blocked write; after each write that
// returns it reports drops it has not reported yet (the moment stderr is
// known to drain again). On stop it writes out what waits and returns.
func (s *Sink) drain() {
	var reported uint64
	for {
		select {
		case <-s.wake:
		case <-s.stop:
			s.writeWaiting(&reported)
			close(s.closed)
			return
		}
		s.writeWaiting(&reported)
	}
}

func (s *Sink) writeWaiting(reported *uint64) {
	for line, ok := s.pop(); ok; line, ok = s.pop() {
		_, _ = s.w.Write(line)
		if d := s.dropped.Load(); d > *reported {
			s.direct.Warn().Uint64("dropped_lines", d-*reported).Uint64("dropped_lines_total", d).
				Msg("log lines dropped: stderr was not read fast enough")
			*reported = d
		}
	}
}

// Dropped is how many log lines were lost so far: pushed out of the full
// ring, or refused by the full queue of the standard logger.
func (s *Sink) Dropped() uint64 {
	return s.dropped.Load() + s.stdlogDropped.Load()
}

// CaptureStdlog sends the standard library's log package to logger
// through a bounded queue: its default output is a synchronous write to
// stderr, which a stuck reader would block like any other.
func (s *Sink) CaptureStdlog(logger zerolog.Logger) {
	s.stdlog = make(chan string, stdlogQueue)
	s.stdlogStop = make(chan struct{})
	s.stdlogDone = make(chan struct{})
	s.stdlogPrev, s.stdlogFlag = log.Writer(), log.Flags()
	log.SetFlags(0) // zerolog adds the time
	log.SetOutput(stdlogWriter{s})
	// client-go (the kube backend) logs through klog, which writes straight
	// to stderr by default: the same queue takes its lines, one per call.
	w := stdlogWriter{s}
	klog.SetLogger(funcr.New(func(prefix, args string) {
		_, _ = w.Write([]byte(strings.TrimSpace("client-go " + prefix + " " + args)))
	}, funcr.Options{}))
	go func() {
		defer close(s.stdlogDone)
		for {
			select {
			case line := <-s.stdlog:
				logger.Warn().Str("component", "stdlib").Msg(line)
			case <-s.stdlogStop:
				for {
					select {
					case line := <-s.stdlog:
						logger.Warn().Str("component", "stdlib").Msg(line)
					default:
						return
					}
				}
			}
		}
	}()
}

type stdlogWriter struct{ s *Sink }

func (w stdlogWriter) Write(p []byte) (int, error) {
	select {
	case w.s.stdlog <- string(bytes.TrimRight(p, "\n")):
	default:
		w.s.stdlogDropped.Add(1)
	}
	return len(p), nil
}

// Close writes out what the ring still holds and stops its writer
// goroutine, so the last lines of a normal shutdown are not lost. When the
// writer does not drain (a host that never reads stderr) it gives up after
// timeout and reports false: shutdown is never held hostage by the log.
func (s *Sink) Close(timeout time.Duration) bool {
	s.closeOnce.Do(func() {
		if s.stdlogStop != nil {
			log.SetOutput(s.stdlogPrev)
			log.SetFlags(s.stdlogFlag)
			close(s.stdlogStop)
		}
		go func() {
			if s.stdlogDone != nil {
				<-s.stdlogDone
			}
			close(s.stop)
		}()
	})
	select {
	case <-s.closed:
		return true
	case <-time.After(timeout):
		return false
	}
}
