package runtime

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func unlimited() *lineBudget { return newLineBudget(func() int { return 1 << 40 }) }

func lineStrings(ls []Line) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = string(l.Data)
		if l.TooLong {
			out[i] = "<dropped>"
		}
	}
	return out
}

// TestLineHubReplay: what the next attacher gets. Lines arrive while
// nobody is attached (before), a socket attaches and dies handing some back
// (unsent), more lines arrive (after), and the next socket attaches.
func TestLineHubReplay(t *testing.T) {
	tests := []struct {
		name                  string
		maxLines, maxBytes    int
		before, unsent, after []string
		want                  []string
		dropped               int
	}{
		{"everything fits", 10, 100, []string{"a", "b"}, nil, nil, []string{"a", "b"}, 0},
		{"line bound drops the oldest", 2, 100, []string{"1", "2", "3", "4"}, nil, nil, []string{"3", "4"}, 2},
		{"byte bound drops the oldest", 10, 4, []string{"aa", "bb", "cc"}, nil, nil, []string{"bb", "cc"}, 1},
		{"a line over the byte bound empties the buffer", 10, 4, []string{"a", "bbbbbb"}, nil, nil, []string{}, 2},
		{"zero lines keeps nothing", 0, 100, []string{"a"}, nil, nil, []string{}, 1},
		{"unsent lines go back in front", 10, 100, []string{"1", "2"}, []string{"2"}, []string{"3"}, []string{"2", "3"}, 0},
		{"unsent lines respect the bounds", 2, 100, []string{"1", "2"}, []string{"1", "2"}, []string{"3"}, []string{"2", "3"}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newLineHub(tc.maxLines, tc.maxBytes, unlimited(), nil, nil)
			deliver := func(ss []string) {
				for _, s := range ss {
					h.deliver(Line{Data: []byte(s)})
				}
			}
			deliver(tc.before)
			if tc.unsent != nil {
				a := h.attach()
				var back []Line
				for _, s := range tc.unsent {
					back = append(back, Line{Data: []byte(s)})
				}
				a.Detach(back...)
			}
			deliver(tc.after)
			b := h.attach()
			assert.Equal(t, tc.want, lineStrings(b.Backlog))
			assert.Equal(t, tc.dropped, b.Dropped, "drops since the previous attach")
			assert.Equal(t, 0, h.pending(), "the backlog moved to the attacher")
			b.Detach()
			assert.Equal(t, 0, h.attach().Dropped, "a drop is reported once")
		})
	}
}

// TestLineHubTakeover: the latest attacher gets the live lines; every
// previous one learns it was taken over, in order.
func TestLineHubTakeover(t *testing.T) {
	tests := []struct {
		name      string
		attachers int
	}{
		{"second attacher", 2},
		{"five in a row", 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newLineHub(10, 100, unlimited(), nil, nil)
			var as []*Attachment
			for range tc.attachers {
				as = append(as, h.attach())
			}
			for _, a := range as[:len(as)-1] {
				select {
				case <-a.TakenOver:
				default:
					t.Fatal("an earlier attacher was not told it was taken over")
				}
			}
			last := as[len(as)-1]
			h.deliver(Line{Data: []byte("live")})
			<-last.Ready
			got, ended := last.Take()
			assert.Equal(t, []string{"live"}, lineStrings(got))
			assert.False(t, ended)
			select {
			case <-last.TakenOver:
				t.Fatal("the latest attacher must not be taken over")
			default:
			}
		})
	}
}

// TestReadLine: how the pump splits stdout, and what it drops.
func TestReadLine(t *testing.T) {
	big := strings.Repeat("x", 300<<10)
	tests := []struct {
		name    string
		input   string
		limit   int
		budget  int
		want    []string
		over    []bool // OverBudget per line
		charged int    // budget in use after the last line
	}{
		{"lines and a last line without newline", "a\nb\n\nc", 1 << 20, 1 << 20, []string{"a", "b", "", "c"}, nil, 0},
		{"a line over the limit is dropped, the next kept", strings.Repeat("y", 100) + "\nok\n", 50, 1 << 20, []string{"<dropped>", "ok"}, []bool{false, false}, 0},
		{"a line past the budget is dropped and marked", big + "\nok\n", 1 << 20, 100 << 10, []string{"<dropped>", "ok"}, []bool{true, false}, 0},
		{"short lines need no budget at all", "a\nb\n", 1 << 20, 0, []string{"a", "b"}, nil, 0},
		{"a long line within the budget is kept and released", big + "\n", 1 << 20, 1 << 20, []string{big}, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			budget := newLineBudget(func() int { return tc.budget })
			br := bufio.NewReaderSize(strings.NewReader(tc.input), 4096)
			var got []string
			var over []bool
			drops := 0
			for {
				l, err := readLine(br, tc.limit, budget, func(bool) { drops++ })
				if len(l.Data) > 0 || l.TooLong || err == nil {
					got = append(got, lineStrings([]Line{l})[0])
					over = append(over, l.OverBudget)
				}
				if err != nil {
					require.ErrorIs(t, err, io.EOF)
					break
				}
			}
			assert.Equal(t, tc.want, got)
			if tc.over != nil {
				assert.Equal(t, tc.over, over)
			}
			dropped := 0
			for _, s := range got {
				if s == "<dropped>" {
					dropped++
				}
			}
			assert.Equal(t, dropped, drops, "each drop is reported once, when it starts")
			assert.Equal(t, tc.charged, budget.used, "the budget is released")
		})
	}
}

// TestLineBudgetShared: unfinished lines of several processes draw on one
// budget; what one holds, another cannot take.
func TestLineBudgetShared(t *testing.T) {
	budget := newLineBudget(func() int { return 1 << 20 })
	// Process A holds an unfinished 700 KiB line.
	ra, wa := io.Pipe()
	defer wa.Close()
	aDone := make(chan Line, 1)
	go func() {
		l, _ := readLine(bufio.NewReaderSize(ra, 64<<10), MaxLineBytes, budget, nil)
		aDone <- l
	}()
	_, err := io.WriteString(wa, strings.Repeat("a", 700<<10))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		budget.mu.Lock()
		defer budget.mu.Unlock()
		return budget.used > 0
	}, 5*time.Second, time.Millisecond)

	// Process B's 700 KiB line does not fit beside it: dropped, marked.
	lb, err := readLine(bufio.NewReaderSize(strings.NewReader(strings.Repeat("b", 700<<10)+"\nshort\n"), 64<<10), MaxLineBytes, budget, nil)
	require.NoError(t, err)
	assert.True(t, lb.TooLong && lb.OverBudget)

	// A finishes its line and gets all of it.
	_, err = io.WriteString(wa, "\n")
	require.NoError(t, err)
	la := <-aDone
	assert.Len(t, la.Data, 700<<10)
	assert.False(t, la.TooLong)
	assert.Equal(t, 0, budget.used)
}

// TestLineHubQueueBound: an attached reader that does not take its lines
// holds the pump at the replay bounds (lines queued plus the batch being
// sent), and what it never took goes to the next attacher.
func TestLineHubQueueBound(t *testing.T) {
	tests := []struct {
		name               string
		maxLines, maxBytes int
		lines              []string
		held               int      // lines delivered before the pump waits
		replayed           []string // what the next attacher gets
	}{
		{"line bound", 3, 100, []string{"a", "b", "c", "d", "e"}, 3, []string{"d", "e"}},
		{"byte bound", 10, 4, []string{"aa", "bb", "cc", "dd"}, 2, []string{"cc", "dd"}},
		{"a line over the byte bound still goes alone", 10, 4, []string{"aaaaaa", "b"}, 1, []string{"b"}},
		{"zero lines passes one at a time and keeps none", 0, 100, []string{"a", "b"}, 1, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newLineHub(tc.maxLines, tc.maxBytes, unlimited(), nil, nil)
			a := h.attach()
			delivered := make(chan int, len(tc.lines))
			go func() {
				for i, s := range tc.lines {
					h.deliver(Line{Data: []byte(s)})
					delivered <- i + 1
				}
			}()
			var n int
			for n < tc.held {
				n = <-delivered
			}
			select {
			case n = <-delivered:
				t.Fatalf("the pump delivered %d lines past the bound of %d", n, tc.held)
			case <-time.After(50 * time.Millisecond):
			}
			<-a.Ready
			got, _ := a.Take()
			assert.Equal(t, tc.lines[:tc.held], lineStrings(got))
			// The batch is still being sent: no room yet.
			select {
			case n = <-delivered:
				t.Fatalf("the pump delivered line %d while the batch was unsent", n)
			case <-time.After(50 * time.Millisecond):
			}
			a.Detach()
			for n < len(tc.lines) {
				n = <-delivered
			}
			b := h.attach()
			assert.Equal(t, tc.replayed, lineStrings(b.Backlog), "what the detached reader never took is replayed")
		})
	}
}

// TestLineHubQueueHandOver: lines queued for a reader and not taken go to
// whoever takes over, or back to the replay buffer on detach; the end of
// the stream reaches the current reader after its lines.
func TestLineHubQueueHandOver(t *testing.T) {
	tests := []struct {
		name string
		next func(h *lineHub, a *Attachment) *Attachment
	}{
		{"taken over", func(h *lineHub, _ *Attachment) *Attachment { return h.attach() }},
		{"detached, then attached again", func(h *lineHub, a *Attachment) *Attachment { a.Detach(); return h.attach() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newLineHub(10, 100, unlimited(), nil, nil)
			a := h.attach()
			h.deliver(Line{Data: []byte("1")})
			h.deliver(Line{Data: []byte("2")})
			b := tc.next(h, a)
			assert.Equal(t, []string{"1", "2"}, lineStrings(b.Backlog))
			got, _ := a.Take()
			assert.Empty(t, got, "the previous reader's queue moved on")
			h.pump(strings.NewReader("3\n"))
			<-b.Ready
			got, ended := b.Take()
			assert.Equal(t, []string{"3"}, lineStrings(got))
			assert.True(t, ended)
		})
	}
}

// TestLineHubBacklogHoldsRoom: a backlog handed to an attacher counts
// against the bounds until the attacher takes its next batch, so a reader
// stalled on the backlog does not let a second bound's worth queue up.
func TestLineHubBacklogHoldsRoom(t *testing.T) {
	h := newLineHub(2, 100, unlimited(), nil, nil)
	h.deliver(Line{Data: []byte("old1")})
	h.deliver(Line{Data: []byte("old2")})
	a := h.attach()
	require.Equal(t, []string{"old1", "old2"}, lineStrings(a.Backlog))
	delivered := make(chan struct{})
	go func() {
		h.deliver(Line{Data: []byte("new")})
		close(delivered)
	}()
	select {
	case <-delivered:
		t.Fatal("a line was queued while the backlog still held the bounds")
	case <-time.After(50 * time.Millisecond):
	}
	got, _ := a.Take() // the backlog is sent
	assert.Empty(t, got)
	<-delivered
	got, _ = a.Take()
	assert.Equal(t, []string{"new"}, lineStrings(got))
}
