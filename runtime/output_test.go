package runtime

import (
	"bytes"
	"io"
	"math/rand/v2"
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

// naiveHeadTail is the specification: keep every byte, then cut.
func naiveHeadTail(all []byte, limit int) (head, tail []byte) {
	headCap := limit * 6 / 10
	tailCap := limit - headCap
	head = all[:min(len(all), headCap)]
	rest := all[len(head):]
	tail = rest[max(0, len(rest)-tailCap):]
	return head, tail
}

// Any sequence of writes keeps exactly the first 60 % and the last 40 %,
// whatever the write sizes and however the buffers grew.
func TestHeadTailMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 500 {
		limit := 1024 + rng.IntN(8192)
		var all []byte
		h := newHeadTail(limit)
		writes := rng.IntN(40)
		for range writes {
			size := rng.IntN(limit / 2)
			if rng.IntN(10) == 0 {
				size = limit + rng.IntN(limit) // a write longer than the whole cap
			}
			chunk := make([]byte, size)
			for i := range chunk {
				chunk[i] = byte('a' + rng.IntN(26))
			}
			all = append(all, chunk...)
			n, err := h.Write(chunk)
			require.NoError(t, err)
			require.Equal(t, size, n)
		}
		head, tail := naiveHeadTail(all, limit)
		ringTail := append(append([]byte{}, h.tail[h.tailPos:]...), h.tail[:h.tailPos]...)
		require.Equal(t, string(head), string(h.head), "iteration %d: head", iter)
		require.Equal(t, string(tail), string(ringTail), "iteration %d: tail", iter)
		require.Equal(t, int64(len(all)), h.total)
		require.Equal(t, len(all) > limit, h.Truncated())
		require.LessOrEqual(t, cap(h.head), h.headCap, "head never grows past its share")
		require.LessOrEqual(t, cap(h.tail), h.tailCap, "tail never grows past its share")
		if !h.Truncated() {
			require.Equal(t, string(all), h.String())
		}
	}
}

// A command that prints a few bytes costs a few hundred bytes, not the
// 1 MiB cap: nothing is reserved up front.
func TestHeadTailSmallOutputDoesNotAllocateTheCap(t *testing.T) {
	h := newHeadTail(1 << 20)
	assert.Zero(t, cap(h.head)+cap(h.tail), "nothing allocated before output arrives")
	_, _ = h.Write([]byte("hello\n"))
	assert.Equal(t, minGrow, cap(h.head))
	assert.Zero(t, cap(h.tail))

	var bytesPerExec float64
	allocs := testing.AllocsPerRun(100, func() {
		out, errs := newHeadTail(1<<20), newHeadTail(1<<20)
		_, _ = out.Write([]byte("hello\n"))
		bytesPerExec = float64(cap(out.head) + cap(out.tail) + cap(errs.head) + cap(errs.tail))
		if out.String() != "hello\n" || errs.String() != "" {
			t.Fatal("wrong output")
		}
	})
	// two structs, one head buffer, one result string
	assert.LessOrEqual(t, allocs, 4.0)
	assert.LessOrEqual(t, bytesPerExec, float64(minGrow))
}

// Growth is geometric: a stream that fills the cap in small writes
// reallocates O(log cap) times, not once per write.
func TestHeadTailGrowthIsAmortised(t *testing.T) {
	line := []byte(strings.Repeat("y", 99) + "\n")
	allocs := testing.AllocsPerRun(5, func() {
		h := newHeadTail(1 << 20)
		for range (1 << 20) / len(line) {
			_, _ = h.Write(line)
		}
	})
	// head: 512 B → 629 KiB in ~11 doublings; tail: ~11 more; plus the struct
	assert.Less(t, allocs, 30.0)
}

// Once the ring is full it is reused in place: writing more output
// allocates nothing.
func TestHeadTailRingDoesNotAllocate(t *testing.T) {
	h := newHeadTail(4096)
	_, _ = h.Write(bytes.Repeat([]byte("z"), 10000))
	chunk := []byte("0123456789abcdef")
	allocs := testing.AllocsPerRun(100, func() { _, _ = h.Write(chunk) })
	assert.Zero(t, allocs)
}

// TestLockedHeadTailReadFrom: io.Copy into an exec's output goes through
// ReadFrom and keeps what Write would.
func TestLockedHeadTailReadFrom(t *testing.T) {
	data := strings.Repeat("0123456789", 10_000)
	viaCopy := &lockedHeadTail{h: newHeadTail(1000)}
	n, err := io.Copy(viaCopy, struct{ io.Reader }{strings.NewReader(data)}) // no WriterTo: ReadFrom runs
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), n)
	viaWrite := &lockedHeadTail{h: newHeadTail(1000)}
	_, _ = viaWrite.Write([]byte(data))
	got, gotTrunc, gotTotal := viaCopy.snapshot()
	want, wantTrunc, wantTotal := viaWrite.snapshot()
	assert.Equal(t, want, got)
	assert.Equal(t, wantTrunc, gotTrunc)
	assert.Equal(t, wantTotal, gotTotal)
}

// TestLockedHeadTailReadFromSizedToNeed: output that fits the head is read
// straight into it, which grows with the output (no 32 KiB read buffer per
// stream), while a waiter may take snapshots.
func TestLockedHeadTailReadFromSizedToNeed(t *testing.T) {
	data := strings.Repeat("line of output\n", 600) // 9000 bytes
	l := &lockedHeadTail{h: newHeadTail(1 << 20)}
	pr, pw := io.Pipe()
	go func() {
		for rest := data; len(rest) > 0; {
			k := min(len(rest), 4096)
			_, _ = pw.Write([]byte(rest[:k]))
			rest = rest[k:]
		}
		pw.Close()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100; i++ {
			s, _, total := l.snapshot()
			assert.Equal(t, data[:total], s, "a snapshot is a prefix of the output")
		}
	}()
	n, err := io.Copy(l, struct{ io.Reader }{pr})
	<-done
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), n)
	got, trunc, total := l.snapshot()
	assert.Equal(t, data, got)
	assert.False(t, trunc)
	assert.Equal(t, int64(len(data)), total)
	assert.LessOrEqual(t, cap(l.h.head), 16<<10, "the head grew with the output")
}
