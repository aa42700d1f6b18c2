package sandboxagent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// runID reads frames of the host's until its run, and returns its id.
func (f fake) runID() (uint64, error) {
	for {
		s, err := f.readJSON()
		if err != nil {
			return 0, err
		}
		var m runMsg
		if json.Unmarshal([]byte(s), &m) == nil && m.Op == opRun {
			return m.ID, nil
		}
	}
}

// runAnswers reads the run, says started, then a frame of each format
// with its id.
func runAnswers(formats ...string) func(fake) error {
	return func(f fake) error {
		if err := f.hello(); err != nil {
			return err
		}
		id, err := f.runID()
		if err != nil {
			return err
		}
		if err := f.send(fmt.Sprintf(`{"op":"started","id":%d,"pid":1234}`, id)); err != nil {
			return err
		}
		for _, format := range formats {
			if strings.Contains(format, "%d") {
				format = fmt.Sprintf(format, id)
			}
			if err := f.send(format); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestHostileStreamAgent(t *testing.T) {
	chunk := base64.StdEncoding.EncodeToString(make([]byte, streamChunk))
	over := base64.StdEncoding.EncodeToString(make([]byte, streamChunk+1))
	floods := make([]string, streamWindow/streamChunk+1)
	for i := range floods {
		floods[i] = `{"op":"output","id":%d,"fd":1,"data":"` + chunk + `"}`
	}
	for _, tc := range []struct {
		name   string
		script func(fake) error
		want   string
	}{
		{"output for unknown id", runAnswers(`{"op":"output","id":99,"fd":1,"data":"aGk="}`), "output for id 99"},
		{"output fd 0", runAnswers(`{"op":"output","id":%d,"fd":0,"data":"aGk="}`), "fd 0 is not an output"},
		{"output fd 3", runAnswers(`{"op":"output","id":%d,"fd":3,"data":"aGk="}`), "fd 3 is not an output"},
		{"output empty", runAnswers(`{"op":"output","id":%d,"fd":1,"data":""}`), "0 bytes of data"},
		{"output over a chunk", runAnswers(`{"op":"output","id":%d,"fd":1,"data":"` + over + `"}`), "32769 bytes of data"},
		{"output not base64", runAnswers(`{"op":"output","id":%d,"fd":1,"data":"!!"}`), "illegal base64"},
		{"output over the window", runAnswers(floods...), "window left"},
		{"output unknown field", runAnswers(`{"op":"output","id":%d,"fd":1,"data":"aGk=","more":1}`), `unknown field "more"`},
		{"output after exited", runAnswers(`{"op":"exited","id":%d,"code":0,"signal":0}`, `{"op":"output","id":%d,"fd":1,"data":"aGk="}`), "no running stream process"},
		{"credit with nothing in flight", runAnswers(`{"op":"credit","id":%d,"bytes":1}`), "credit of 1 bytes with 0 in flight"},
		{"credit negative", runAnswers(`{"op":"credit","id":%d,"bytes":-5}`), "credit of -5 bytes"},
		{"credit for unknown id", runAnswers(`{"op":"credit","id":77,"bytes":1}`), "credit for id 77"},
		{"credit wrong type", runAnswers(`{"op":"credit","id":%d,"bytes":"1"}`), "cannot unmarshal string"},
		{"input from the agent", runAnswers(`{"op":"input","id":%d,"data":"aGk="}`), `unknown op "input"`},
		{"silence on run", func(f fake) error { return f.hello() }, "no answer to spawn 1 within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := hostileStream(t, tc.script)
			var pe *ProtocolError
			if !errors.As(err, &pe) || !strings.Contains(pe.Reason, tc.want) {
				t.Errorf("got %v, want a ProtocolError with %q", err, tc.want)
			}
		})
	}
}

// hostileStream runs script as an agent behind a bridge, and the host's
// Run and Wait of a process with stdin, and returns the host's error.
func hostileStream(t *testing.T, script func(fake) error) error {
	t.Helper()
	ours, theirs, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	fakeDone := make(chan error, 1)
	go func() {
		defer ours.Close()
		f := fake{ours}
		if err := script(f); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			fakeDone <- err
			return
		}
		ours.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.Copy(io.Discard, ours)
		fakeDone <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := Bridge(ctx, theirs, theirs)
	if err != nil {
		return err
	}
	c.timeout = time.Second
	defer c.Close()
	// Output is never written out: the window is all the agent has.
	stuck := writerFunc(func(b []byte) (int, error) {
		<-c.Done()
		return 0, c.Err()
	})
	p, err := c.Run(ctx, RunRequest{Argv: []string{"cat"}, Stdin: strings.NewReader(""), Stdout: stuck})
	if err == nil {
		_, err = p.Wait(ctx)
	}
	if err == nil {
		// What comes after the exit is read too.
		select {
		case <-c.Done():
			err = c.Err()
		case <-time.After(3 * time.Second):
		}
	}
	if ferr := <-fakeDone; ferr != nil {
		t.Errorf("fake agent: %v", ferr)
	}
	return err
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
