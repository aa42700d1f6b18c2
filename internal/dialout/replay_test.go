package dialout

import (
	"encoding/json"
	"fmt"
	"testing"
)

func answer(id int) []byte { return []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{}}`, id)) }

func notification(n int) []byte {
	return []byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"box_exec_output","params":{"seq":%d}}`, n))
}

func TestReplayKeepsWhatThePeerLacksInOrder(t *testing.T) {
	r := replay{lim: DefaultLimits}
	frames := [][]byte{answer(1), notification(1), answer(2), notification(2)}
	for i, f := range frames {
		c := Keep
		if i%2 == 1 {
			c = Bulk
		}
		r.add(uint64(i+1), f, c)
	}
	got, lost, err := r.since(1, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[0]) != string(frames[1]) || string(got[2]) != string(frames[3]) {
		t.Errorf("replay after 1 = %q", got)
	}
	if len(lost.IDs) != 0 || lost.Bulk != 0 {
		t.Errorf("nothing was evicted, got %+v", lost)
	}
	if _, _, err := r.since(5, 4); err == nil {
		t.Error("a peer claiming more frames than were sent is refused")
	}
}

func TestReplayBoundsAndReportsWhatItDropped(t *testing.T) {
	r := replay{lim: Limits{KeepFrames: 3, KeepBytes: 1 << 20, BulkBytes: 3 * len(notification(0))}}
	seq := uint64(0)
	for i := range 5 { // answers 0..4: 0 and 1 are evicted
		seq++
		r.add(seq, answer(i), Keep)
	}
	for i := range 10 { // 7 of 10 notifications are dropped
		seq++
		r.add(seq, notification(i), Bulk)
	}
	if r.keep.bytes > r.lim.KeepBytes || len(r.keep.items) != 3 || r.bulk.bytes > r.lim.BulkBytes {
		t.Fatalf("over the limits: %d answers, %d bytes of notifications", len(r.keep.items), r.bulk.bytes)
	}
	// The peer had the first answer only.
	got, lost, err := r.since(1, seq)
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := json.Marshal(lost.IDs); string(ids) != "[1]" {
		t.Errorf("lost ids = %s, want [1] (answer 0 was received)", ids)
	}
	if lost.Bulk != 7 {
		t.Errorf("notifications lost = %d, want 7", lost.Bulk)
	}
	if len(got) != 6 {
		t.Errorf("replayed %d frames, want the 3 answers and 3 notifications kept", len(got))
	}
	// Reported once.
	if _, lost, _ := r.since(1, seq); len(lost.IDs) != 0 || lost.Bulk != 0 {
		t.Errorf("lost reported twice: %+v", lost)
	}
}

func TestReplayKeepsOneOversizedFrame(t *testing.T) {
	r := replay{lim: Limits{KeepFrames: 10, KeepBytes: 8, BulkBytes: 8}}
	r.add(1, answer(1), Keep)
	if len(r.keep.items) != 1 {
		t.Error("the newest frame is kept even over the byte limit")
	}
}

func TestFrameID(t *testing.T) {
	for frame, want := range map[string]string{
		`{"jsonrpc":"2.0","id":42,"result":{"id":7}}`:                                    "42",
		`{"jsonrpc":"2.0","id":"a,b","result":{}}`:                                       `"a,b"`,
		`{"method":"box_exec","params":{"cmd":"echo \"id\":9"},"id":12,"jsonrpc":"2.0"}`: "12",
		`{"method":"x","params":{"id":3},"id":"s","jsonrpc":"2.0"}`:                      `"s"`,
		`{"jsonrpc":"2.0","method":"box_exec_output","params":{"id":5}}`:                 "",
		`{"jsonrpc":"2.0","id":null,"error":{}}`:                                         "",
	} {
		if got := string(frameID([]byte(frame))); got != want {
			t.Errorf("frameID(%s) = %q, want %q", frame, got, want)
		}
	}
}

// The record of evictions is a ring: past its size it forgets the oldest
// (the likeliest to have been received), in constant time per eviction.
func TestReplayEvictionRecordWraps(t *testing.T) {
	r := replay{lim: Limits{KeepFrames: 1, KeepBytes: 1 << 20, BulkBytes: 1}}
	total := evictedMax + 1000
	for i := 1; i <= total+1; i++ {
		r.add(uint64(i), notification(i), Bulk)
	}
	if len(r.evictedBulk.items) != evictedMax {
		t.Fatalf("record holds %d, want %d", len(r.evictedBulk.items), evictedMax)
	}
	_, lost, err := r.since(uint64(total-10), uint64(total+1))
	if err != nil {
		t.Fatal(err)
	}
	if lost.Bulk != 10 {
		t.Errorf("notifications lost after the peer's count = %d, want 10", lost.Bulk)
	}
}
