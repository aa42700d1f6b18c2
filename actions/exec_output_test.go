package actions

import (
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/boxrt/boxrt/reconnect"
	"github.com/boxrt/boxrt/runtime"
)

// TestAppendOutputNotice checks the hand-written box_exec_output encoding
// against encoding/json's of the same notice: valid JSON that decodes to
// the same members, text as data and anything else as data_base64.
func TestAppendOutputNotice(t *testing.T) {
	var every []byte
	for c := 0; c < 256; c++ {
		every = append(every, byte(c))
	}
	var ascii []byte
	for c := 0; c < utf8.RuneSelf; c++ {
		ascii = append(ascii, byte(c))
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 4096)
	for i := range random {
		random[i] = byte(rnd.IntN(256))
	}
	cases := map[string][]byte{
		"empty":             {},
		"text":              []byte(strings.Repeat("0123456789abcdefghijklmnopqrstuvwxyz\n", 100)),
		"ascii":             ascii,
		"html":              []byte(`<a href="x">&amp;</a>`),
		"escapes":           []byte("tab\t cr\r nl\n quote\" backslash\\ bell\a nul\x00 del\x7f"),
		"unicode":           []byte("é ü 日本語 🎉 \u2028 \u2029 end"),
		"every byte":        every,
		"random":            random,
		"cut character":     []byte("caf\xc3"),
		"invalid in middle": []byte("ok \xff\xfe ok"),
		"latin1":            []byte("caf\xe9\n"),
		"surrogate":         []byte("\xed\xa0\x80"),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			c := runtime.ExecChunk{ExecID: "x-0123", Seq: 7, Stream: runtime.StreamStderr, Offset: 1 << 40, Data: data}
			got := appendOutputNotice(nil, c, json.RawMessage(`"req-1"`))
			if !json.Valid(got) {
				t.Fatalf("not valid JSON: %q", got)
			}
			var dec reconnect.OutputParams
			if err := json.Unmarshal(got, &dec); err != nil {
				t.Fatal(err)
			}
			want := reconnect.OutputParams{ExecID: c.ExecID, RequestID: json.RawMessage(`"req-1"`), Seq: c.Seq, Stream: c.Stream, Offset: c.Offset}
			if utf8.Valid(data) {
				s := string(data)
				want.Data = &s
			} else {
				want.DataBase64 = base64.StdEncoding.EncodeToString(data)
			}
			wantJSON, _ := json.Marshal(want)
			gotJSON, _ := json.Marshal(dec)
			if string(gotJSON) != string(wantJSON) {
				t.Fatalf("decodes to\n%s\nwant\n%s", gotJSON, wantJSON)
			}
		})
	}
	eof := appendOutputNotice(nil, runtime.ExecChunk{ExecID: "x-1", Seq: 3, EOF: true}, nil)
	if want := `{"exec_id":"x-1","seq":3,"offset":0,"eof":true}`; string(eof) != want {
		t.Fatalf("eof notice %s, want %s", eof, want)
	}
}

// FuzzAppendJSONString: whatever the bytes, the string is valid JSON that
// decodes to them when they are UTF-8, and valid says whether they were.
func FuzzAppendJSONString(f *testing.F) {
	f.Add([]byte("hello\n"))
	f.Add([]byte("caf\xe9"))
	f.Add([]byte("\u2028\x00\"\\"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, valid := appendJSONString(nil, data)
		if valid != utf8.Valid(data) {
			t.Fatalf("valid = %v for %q", valid, data)
		}
		var s string
		if err := json.Unmarshal(got, &s); err != nil {
			t.Fatalf("%q: %v", got, err)
		}
		if valid && s != string(data) {
			t.Fatalf("decodes to %q, want %q", s, data)
		}
	})
}

// specialBytes marks exactly the bytes a JSON string cannot hold as they
// are, wherever they sit among any others.
func TestSpecialBytesExact(t *testing.T) {
	for v := range 256 {
		for pos := range 8 {
			for _, fill := range []byte{'a', 0, '"', '\\', 0x1f, 0x20, 0x7f, 0x80, 0xff} {
				var w uint64
				for k := range 8 {
					c := uint64(fill)
					if k == pos {
						c = uint64(v)
					}
					w |= c << (8 * k)
				}
				m := specialBytes(w)
				for k := range 8 {
					c := byte(w >> (8 * k))
					want := c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf
					if got := m>>(8*k+7)&1 == 1; got != want {
						t.Fatalf("byte %#x at %d of %#x: marked %v", c, k, w, got)
					}
				}
			}
		}
	}
}
