package runtime

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeadTail(t *testing.T) {
	tests := []struct {
		name      string
		limit     int
		writes    []string
		want      string
		truncated bool
	}{
		{name: "short output kept verbatim", limit: 100, writes: []string{"hello\n", "world\n"}, want: "hello\nworld\n"},
		{name: "exactly at the limit", limit: 10, writes: []string{"0123456789"}, want: "0123456789"},
		{name: "whitespace is not stripped", limit: 100, writes: []string{"  x  \n\n"}, want: "  x  \n\n"},
		{name: "invalid utf8 replaced not dropped", limit: 100, writes: []string{"a\xffb"}, want: "a\uFFFDb"},
		{name: "head and tail kept", limit: 10, writes: []string{"abcdefghijklmnopqrstuvwxyz"}, want: "abcdef\n... [boxrt: 16 bytes omitted; 26 bytes in total] ...\nwxyz", truncated: true},
		{name: "tail ring across many writes", limit: 10, writes: strings.Split("abcdefghijklmnopqrstuvwxyz", ""), want: "abcdef\n... [boxrt: 16 bytes omitted; 26 bytes in total] ...\nwxyz", truncated: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHeadTail(tc.limit)
			var total int
			for _, w := range tc.writes {
				n, err := h.Write([]byte(w))
				require.NoError(t, err)
				total += n
			}
			assert.Equal(t, tc.want, h.String())
			assert.Equal(t, tc.truncated, h.Truncated())
			assert.Equal(t, int64(total), h.total)
		})
	}
}

func TestHeadTailBoundedMemory(t *testing.T) {
	h := newHeadTail(1 << 20)
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	for range 80 { // 5 MiB
		_, _ = h.Write(chunk)
	}
	assert.LessOrEqual(t, cap(h.head)+cap(h.tail), 1<<20)
	assert.Equal(t, int64(5<<20), h.total)
	assert.True(t, h.Truncated())
}

func TestHeadTailRuneBoundary(t *testing.T) {
	h := newHeadTail(10)
	_, _ = h.Write([]byte(strings.Repeat("é", 20))) // 2 bytes each
	out := h.String()
	assert.NotContains(t, out, "\uFFFD")
	assert.True(t, strings.HasPrefix(out, "ééé"))
	assert.True(t, strings.HasSuffix(out, "éé"))
}
