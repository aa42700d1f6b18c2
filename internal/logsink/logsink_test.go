package logsink

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
)

// gatedWriter blocks every Write until open is closed, like a pipe whose
// reader stopped reading, then appends to buf.
type gatedWriter struct {
	open chan struct{}
	mu   sync.Mutex
	buf  bytes.Buffer
}

func newGatedWriter() *gatedWriter { return &gatedWriter{open: make(chan struct{})} }

func (g *gatedWriter) Write(p []byte) (int, error) {
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Write(p)
}

func (g *gatedWriter) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.String()
}

type logLine struct {
	Level        string `json:"level"`
	Message      string `json:"message"`
	Component    string `json:"component"`
	N            int    `json:"n"`
	Dropped      int    `json:"dropped_lines"`
	DroppedTotal int    `json:"dropped_lines_total"`
}

func parseLines(t *testing.T, out string) []logLine {
	t.Helper()
	var lines []logLine
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var l logLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "not a JSON line: %q", sc.Text())
		lines = append(lines, l)
	}
	return lines
}

// A writer that does not drain never blocks the logging goroutines: the
// lines that do not fit are dropped, counted exactly, and reported in one
// line once the writer drains.
func TestLogSinkNeverBlocksAndCountsDrops(t *testing.T) {
	w := newGatedWriter()
	sink, logger := New(w, "json", zerolog.InfoLevel)
	const total = 5 * logRingLines
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 4 { // several goroutines, as request handlers log
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < total; i += 4 {
				logger.Info().Int("n", i).Msg("line")
			}
		}()
	}
	wg.Wait()
	assert.Less(t, time.Since(start), 5*time.Second, "logging must not wait for the writer")
	// While the writer is stuck the count is already exact: all but the
	// ring's lines and the one in the blocked write are gone.
	stuck := sink.Dropped()
	assert.Equal(t, uint64(total-logRingLines-1), stuck, "drops are counted while stderr is stuck")

	close(w.open)
	require.True(t, sink.Close(10*time.Second), "Close flushes once the writer drains")

	var kept, reports, reported int
	seen := map[int]bool{}
	for _, l := range parseLines(t, w.String()) {
		switch l.Message {
		case "line":
			kept++
			assert.False(t, seen[l.N], "line %d written twice", l.N)
			seen[l.N] = true
		case "log lines dropped: stderr was not read fast enough":
			reports++
			reported += l.Dropped
			assert.Equal(t, "warn", l.Level)
			assert.Equal(t, reported, l.DroppedTotal)
		default:
			t.Errorf("unexpected line %+v", l)
		}
	}
	t.Logf("kept %d, dropped %d in %d report(s)", kept, reported, reports)
	assert.GreaterOrEqual(t, reports, 1)
	assert.LessOrEqual(t, kept, logRingLines+1, "the ring (plus the line blocked in Write) bounds what is kept")
	assert.Equal(t, total, kept+reported, "every line is either written or counted as dropped")
	assert.Equal(t, uint64(reported), sink.Dropped(), "the report says what the metric counts")
}

// In the normal case nothing is lost: Close writes out the lines still in
// the ring, so the last lines of a shutdown reach stderr.
func TestLogSinkCloseFlushes(t *testing.T) {
	var buf bytes.Buffer
	w := &gatedWriter{open: make(chan struct{})}
	close(w.open)
	sink, logger := New(w, "json", zerolog.InfoLevel)
	for i := range 500 {
		logger.Info().Int("n", i).Msg("line")
	}
	logger.Info().Msg("boxrt stopped")
	require.True(t, sink.Close(10*time.Second))
	buf.WriteString(w.String())
	lines := parseLines(t, buf.String())
	require.Len(t, lines, 501)
	for i := range 500 {
		assert.Equal(t, i, lines[i].N, "in order")
	}
	assert.Equal(t, "boxrt stopped", lines[500].Message)
	assert.Zero(t, sink.Dropped())
}

// A line is written out on its own: the writer goroutine does not wait
// for a later line, a poll or Close to pick it up.
func TestLogSinkWritesEachLineAsItComes(t *testing.T) {
	w := &gatedWriter{open: make(chan struct{})}
	close(w.open)
	sink, logger := New(w, "json", zerolog.InfoLevel)
	defer sink.Close(10 * time.Second)
	for i := range 3 {
		logger.Info().Int("n", i).Msg("line")
		require.Eventually(t, func() bool { return len(parseLines(t, w.String())) == i+1 }, 10*time.Second, time.Millisecond,
			"line %d never reached the writer", i)
	}
}

// A writer that never drains cannot hold shutdown: Close gives up.
func TestLogSinkCloseGivesUpOnAStuckWriter(t *testing.T) {
	w := newGatedWriter()
	defer close(w.open)
	sink, logger := New(w, "console", zerolog.InfoLevel)
	logger.Info().Msg("stuck")
	start := time.Now()
	assert.False(t, sink.Close(200*time.Millisecond))
	assert.Less(t, time.Since(start), 2*time.Second)
}

// The standard library's log package (net/http's server errors) goes
// through the sink too, so it cannot block on stderr either.
func TestLogSinkCapturesStdlog(t *testing.T) {
	w := newGatedWriter()
	sink, logger := New(w, "json", zerolog.InfoLevel)
	sink.CaptureStdlog(logger)
	start := time.Now()
	for i := range 2000 {
		log.Printf("http: something %d", i)
	}
	assert.Less(t, time.Since(start), 5*time.Second, "log.Printf must not wait for the writer")
	close(w.open)
	// After the burst has drained: a full queue drops the newest lines, so
	// a klog line logged into it could be among the dropped.
	require.Eventually(t, func() bool { return len(sink.stdlog) == 0 }, 10*time.Second, time.Millisecond)
	klog.Errorf("client-go: something")
	klog.Flush()
	require.True(t, sink.Close(10*time.Second))
	lines := parseLines(t, w.String())
	require.NotEmpty(t, lines)
	var got, klogLines int
	for _, l := range lines {
		if l.Component == "stdlib" && strings.Contains(l.Message, "client-go: something") {
			klogLines++
			continue
		}
		if l.Component == "stdlib" {
			got++
			assert.True(t, strings.HasPrefix(l.Message, "http: something "), l.Message)
			assert.Equal(t, "warn", l.Level)
		}
	}
	assert.Positive(t, got)
	assert.Equal(t, 1, klogLines, "klog (client-go) goes through the sink too")
	assert.Equal(t, log.Writer() != nil, true)
	assert.NotEqual(t, fmt.Sprintf("%T", log.Writer()), "logsink.stdlogWriter", "Close restores the standard logger")
}

// TestConsoleColourOnlyOnATerminal: the console format writes ANSI colour
// codes to a terminal only; a file (boxrt serve --log-format console
// 2>file) gets plain lines.
func TestConsoleColourOnlyOnATerminal(t *testing.T) {
	logTo := func(w *os.File) {
		t.Helper()
		sink, log := New(w, "console", zerolog.InfoLevel)
		log.Info().Str("k", "v").Msg("hello")
		sink.Close(5 * time.Second)
	}
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	require.NoError(t, err)
	defer f.Close()
	logTo(f)
	out, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	assert.Contains(t, string(out), "hello")
	assert.Contains(t, string(out), "k=v")
	assert.NotContains(t, string(out), "\x1b[", "escape codes in a file")

	ptmx, tty, err := pty.Open()
	require.NoError(t, err)
	defer ptmx.Close()
	read := make(chan string, 1)
	go func() {
		var buf bytes.Buffer
		b := make([]byte, 4096)
		for !strings.Contains(buf.String(), "hello") {
			n, err := ptmx.Read(b)
			buf.Write(b[:n])
			if err != nil {
				break
			}
		}
		read <- buf.String()
	}()
	logTo(tty)
	require.NoError(t, tty.Close())
	select {
	case got := <-read:
		assert.Contains(t, got, "\x1b[", "a terminal gets colour")
	case <-time.After(10 * time.Second):
		t.Fatal("nothing read from the terminal")
	}
}
