package echopeer

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
)

// Reply is the answer to the request req.
func Reply(req []byte) []byte {
	var r struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(req, &r); err != nil || len(r.ID) == 0 {
		r.ID = json.RawMessage("null")
	}
	out := make([]byte, 0, 48+len(r.ID))
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, r.ID...)
	out = append(out, `,"result":{}}`...)
	return out
}

// ServeLines answers each line of r on w, one write per answer (boxrt
// flushes each answer too), until r ends.
func ServeLines(r io.Reader, w io.Writer) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 1 {
			out := append(Reply(line[:len(line)-1]), '\n')
			if _, werr := w.Write(out); werr != nil {
				return werr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
