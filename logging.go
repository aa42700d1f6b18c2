package main

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
	"github.com/rs/zerolog/diode"
	"k8s.io/klog/v2"
)

const (
	// logRingLines bounds the log lines waiting for stderr. A host that
	// reads stderr drains them far faster than boxrt writes them; one that
	// stops reading costs at most this many lines of memory (plus the
	// pipe's own buffer) and loses the rest, counted.
	logRingLines = 1024
	// logPollInterval is how often the ring's reader looks for new lines
	// when it found none. zerolog's other reader (the waiter) can miss a
	// wake-up and leave a line waiting until the next one is logged; a
	// line late by at most this much is the better trade.
	logPollInterval = 10 * time.Millisecond
	// stdlogQueue bounds lines of the standard library's log package
	// (net/http's server errors, the diode's own notices) waiting to be
	// turned into zerolog lines.
	stdlogQueue = 256
)

// logSink is where boxrt's logs go: stderr (or any writer) behind a
// bounded, lock-free ring (zerolog's diode writer), so that logging never
// blocks request handling. A host that pipes stderr and never reads it
// fills the pipe; before the ring, the next log write blocked whichever
// goroutine was answering a request, and the protocol stalled. Now a full
// ring overwrites its oldest lines, the count goes to Dropped (exported as
// boxrt_log_dropped_lines_total), and once stderr drains again one warning
// line says how many were lost.
type logSink struct {
	ring diode.Writer
	// in counts lines handed to the ring, out lines its reader wrote out;
	// detected sums the drops the reader noticed (it notices only when it
	// reads again, that is once stderr drains); high is the largest value
	// Dropped returned, which keeps it monotonic.
	in, out, detected, high atomic.Uint64
	stdlogDropped           atomic.Uint64

	stdlog     chan string
	stdlogStop chan struct{}
	stdlogDone chan struct{}
	stdlogPrev io.Writer
	stdlogFlag int
	closeOnce  sync.Once
	closed     chan struct{}
}

// newLogSink returns a sink writing to w in the given format ("json" or
// "console", checked by the caller) and a logger at lvl on top of it.
func newLogSink(w io.Writer, format string, lvl zerolog.Level) (*logSink, zerolog.Logger) {
	s := &logSink{closed: make(chan struct{})}
	// The drop report is written straight to w: it runs on the ring's
	// reader goroutine, right after a write to w returned, which is the
	// moment stderr is known to drain again.
	direct := zerolog.New(formatted(w, format)).Level(lvl).With().Timestamp().Logger()
	s.ring = diode.NewWriter(countingWriter{w, &s.out}, logRingLines, logPollInterval, func(missed int) {
		total := s.detected.Add(uint64(missed))
		direct.Warn().Int("dropped_lines", missed).Uint64("dropped_lines_total", total).
			Msg("log lines dropped: stderr was not read fast enough")
	})
	// zerolog (and its console writer) writes one event per Write call.
	in := countingWriter{s.ring, &s.in}
	return s, zerolog.New(formatted(in, format)).Level(lvl).With().Timestamp().Logger()
}

func formatted(w io.Writer, format string) io.Writer {
	if format == "console" {
		return zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return w
}

// Dropped is how many log lines were lost so far. While stderr is stuck
// the ring's reader cannot notice drops, so the lines that cannot be in
// the ring any more are counted too: of the lines handed in and not yet
// written out, at most logRingLines wait in the ring and one in the
// blocked write, so any excess is lost. Once the reader catches up its own
// count takes over (it may include the rare slot the diode skipped on a
// write collision, which it reports on the standard logger).
func (s *logSink) Dropped() uint64 {
	in := s.in.Load() // in before out: the difference can only be too small
	out := s.out.Load()
	n := s.detected.Load()
	if in > out+logRingLines+1 {
		n = max(n, in-out-logRingLines-1)
	}
	n += s.stdlogDropped.Load()
	for {
		high := s.high.Load()
		if n <= high {
			return high
		}
		if s.high.CompareAndSwap(high, n) {
			return n
		}
	}
}

// captureStdlog sends the standard library's log package to logger
// through a bounded queue: its default output is a synchronous write to
// stderr, which a stuck reader would block like any other. The queue also
// breaks a cycle: the diode reports its own rare write collisions with
// log.Println, and that must not re-enter the ring from inside a write.
func (s *logSink) captureStdlog(logger zerolog.Logger) {
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

type stdlogWriter struct{ s *logSink }

func (w stdlogWriter) Write(p []byte) (int, error) {
	select {
	case w.s.stdlog <- string(bytes.TrimRight(p, "\n")):
	default:
		w.s.stdlogDropped.Add(1)
	}
	return len(p), nil
}

// Close writes out what the ring still holds and stops its reader, so the
// last lines of a normal shutdown are not lost. When the writer does not
// drain (a host that never reads stderr) it gives up after timeout and
// reports false: shutdown is never held hostage by the log.
func (s *logSink) Close(timeout time.Duration) bool {
	s.closeOnce.Do(func() {
		go func() {
			if s.stdlogStop != nil {
				log.SetOutput(s.stdlogPrev)
				log.SetFlags(s.stdlogFlag)
				close(s.stdlogStop)
				<-s.stdlogDone
			}
			_ = s.ring.Close()
			close(s.closed)
		}()
	})
	select {
	case <-s.closed:
		return true
	case <-time.After(timeout):
		return false
	}
}

// countingWriter counts the Write calls to w. Used under the ring it also
// hides w's Close: diode.Writer.Close closes the writer it wraps, and
// stderr must stay open for main's last error message.
type countingWriter struct {
	w io.Writer
	n *atomic.Uint64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(1)
	return n, err
}
