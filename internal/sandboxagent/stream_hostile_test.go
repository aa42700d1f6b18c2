package sandboxagent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
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

// TestAgentRefusesBadStreamFrames: the agent bounds what the host says
// too: window overruns and malformed stream frames end the connection
// (the process runs on).
func TestAgentRefusesBadStreamFrames(t *testing.T) {
	sock, _ := streamAgent(t)
	big := `"` + base64.StdEncoding.EncodeToString(make([]byte, streamChunk)) + `"`
	// The window, what the pipe takes (64 KiB) and more.
	over := make([]string, streamWindow/streamChunk+4)
	for i := range over {
		over[i] = `{"op":"input","id":1,"data":` + big + `}`
	}
	for _, tc := range []struct {
		name   string
		frames []string
	}{
		{"credit over the window", []string{`{"op":"credit","id":1,"bytes":1}`}},
		{"credit negative", []string{`{"op":"credit","id":1,"bytes":-1}`}},
		{"input over the window", over},
		{"input over a chunk", []string{`{"op":"input","id":1,"data":"` + base64.StdEncoding.EncodeToString(make([]byte, streamChunk+1)) + `"}`}},
		{"run with a terminal of no size", []string{`{"op":"run","id":2,"argv":["true"],"env":[],"dir":"/","tty":true,"rows":0,"cols":0}`}},
		{"run with an unknown field", []string{`{"op":"run","id":2,"argv":["true"],"env":[],"dir":"/","tty":false,"rows":0,"cols":0,"root":true}`}},
		{"arg with no data", []string{`{"op":"arg","id":2,"data":""}`}},
		{"arg over a chunk", []string{`{"op":"arg","id":2,"data":"` + base64.StdEncoding.EncodeToString(make([]byte, argChunk+1)) + `"}`}},
		{"arg over the kernel's limit", argFrames(2, maxLongArg/argChunk+1)},
		{"args pending for too many ids", pendingArgs(maxPendingArgs + 1)},
		{"long_arg without its arg frames", []string{`{"op":"run","id":2,"argv":["sh","-c",""],"env":[],"dir":"/","tty":false,"rows":0,"cols":0,"long_arg":true}`}},
		{"long_arg with a last argument of its own", append(argFrames(2, 1), `{"op":"run","id":2,"argv":["sh","-c","true"],"env":[],"dir":"/","tty":false,"rows":0,"cols":0,"long_arg":true}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dial(sock)
			for deadline := time.Now().Add(5 * time.Second); err != nil && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				c, err = dial(sock)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			f := fake{c}
			if _, err := f.readJSON(); err != nil {
				t.Fatalf("hello: %v", err)
			}
			// A process that reads nothing: its stdin window fills.
			if err := f.send(`{"op":"run","id":1,"argv":["sleep","30"],"env":["PATH=/usr/bin:/bin"],"dir":"/","tty":false,"rows":0,"cols":0}`); err != nil {
				t.Fatal(err)
			}
			s, err := f.readJSON()
			var st startedMsg
			if err != nil || json.Unmarshal([]byte(s), &st) != nil || st.Op != opStarted {
				t.Fatalf("run: %q %v", s, err)
			}
			defer syscall.Kill(-st.PID, syscall.SIGKILL)
			for _, fr := range tc.frames {
				if err := f.send(fr); err != nil {
					break // dropped already
				}
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				s, err := f.readJSON()
				if err != nil {
					if errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatal("the agent kept the connection")
					}
					break
				}
				if strings.Contains(s, `"started"`) {
					t.Fatalf("the agent ran the bad frame: %s", s)
				}
			}
		})
	}
}

// argFrames is n full arg frames for id.
func argFrames(id, n int) []string {
	data := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("a"), argChunk))
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"op":"arg","id":%d,"data":"%s"}`, id, data)
	}
	return out
}

// pendingArgs is one small arg frame for each of n ids.
func pendingArgs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"op":"arg","id":%d,"data":"YQ=="}`, i+10)
	}
	return out
}
