package sandboxagent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fake is a hostile agent's side of the connection, written frame by
// frame.
type fake struct{ c *net.UnixConn }

func frame(payload string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	return append(b, payload...)
}

func (f fake) raw(b []byte) error {
	_, err := f.c.Write(b)
	return err
}

func (f fake) send(payload string) error { return f.raw(frame(payload)) }

func (f fake) hello() error { return f.send(`{"op":"hello","version":1,"pid":7}`) }

// spawnID reads the host's spawn frame, closes what it carried and
// returns its id.
func (f fake) spawnID() (uint64, error) {
	buf := make([]byte, 4+maxFrame)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	n, oobn, _, _, err := f.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, err
	}
	if msgs, _ := unix.ParseSocketControlMessage(oob[:oobn]); len(msgs) > 0 {
		fds, _ := unix.ParseUnixRights(&msgs[0])
		closeFDs(fds)
	}
	var m spawnMsg
	if n < 4 || json.Unmarshal(buf[4:n], &m) != nil {
		return 0, fmt.Errorf("not a spawn frame: %q", buf[:n])
	}
	return m.ID, nil
}

// readJSON reads one frame of the host's without descriptors.
func (f fake) readJSON() (string, error) {
	var head [4]byte
	if _, err := io.ReadFull(f.c, head[:]); err != nil {
		return "", err
	}
	body := make([]byte, binary.BigEndian.Uint32(head[:]))
	_, err := io.ReadFull(f.c, body)
	return string(body), err
}

// answer reads the spawn and sends a frame of each format with its id.
func (f fake) answer(formats ...string) error {
	id, err := f.spawnID()
	if err != nil {
		return err
	}
	for _, format := range formats {
		if err := f.send(fmt.Sprintf(format, id)); err != nil {
			return err
		}
	}
	return nil
}

// sendFD sends a frame with a descriptor of /etc/passwd on it.
func (f fake) sendFD(payload string) error {
	file, err := os.Open("/etc/passwd")
	if err != nil {
		return err
	}
	defer file.Close()
	_, _, err = f.c.WriteMsgUnix(frame(payload), unix.UnixRights(int(file.Fd())), nil)
	return err
}

func hello(f fake) error { return f.hello() }

// then is the script first, next.
func then(first, next func(fake) error) func(fake) error {
	return func(f fake) error {
		if err := first(f); err != nil {
			return err
		}
		return next(f)
	}
}

func sends(payload string) func(fake) error {
	return func(f fake) error { return f.send(payload) }
}

func answers(formats ...string) func(fake) error {
	return func(f fake) error { return f.answer(formats...) }
}

// TestHostileAgent: whatever a fake agent says wrong is a *ProtocolError
// naming it (or the connection's loss), the host drops the connection,
// closes any descriptor it got, and nothing waits forever.
func TestHostileAgent(t *testing.T) {
	started := `{"op":"started","id":%d,"pid":1234}`
	for _, tc := range []struct {
		name   string
		script func(fake) error
		want   string // in the *ProtocolError's reason; "" for ErrAgentLost
	}{
		{"garbage", func(f fake) error { return f.raw([]byte("GARBAGE GARBAGE GARBAGE")) }, "frame length 1195463234 is outside"},
		{"frame over 64 KiB", sends(`{"op":"hello","pid":7,"version":1,"x":"` + strings.Repeat("a", maxFrame) + `"}`), "frame length 65577 is outside"},
		{"length 2^31", func(f fake) error { return f.raw([]byte{0x80, 0, 0, 0, '{'}) }, "frame length 2147483648 is outside"},
		{"length 0", func(f fake) error { return f.raw([]byte{0, 0, 0, 0}) }, "frame length 0 is outside"},
		{"invalid JSON", sends(`{"op":"hello",`), "invalid JSON"},
		{"not an object", sends(`[1,2]`), "invalid JSON"},
		{"unknown op first", sends(`{"op":"bye"}`), `first frame is "bye", want hello`},
		{"unknown field", sends(`{"op":"hello","version":1,"pid":7,"root":true}`), `unknown field "root"`},
		{"trailing data", sends(`{"op":"hello","version":1,"pid":7} {}`), "invalid JSON: invalid character '{' after top-level value"},
		{"wrong type", sends(`{"op":"hello","version":1,"pid":"7"}`), "cannot unmarshal string"},
		{"wrong version", sends(`{"op":"hello","version":2,"pid":7}`), "version 2, want 1"},
		{"pid 0", sends(`{"op":"hello","version":1,"pid":0}`), "pid 0 is outside 1..4194304"},
		{"pid negative", sends(`{"op":"hello","version":1,"pid":-5}`), "pid -5 is outside"},
		{"pid huge", sends(`{"op":"hello","version":1,"pid":4194305}`), "pid 4194305 is outside"},
		{"pid overflow", sends(`{"op":"hello","version":1,"pid":1e30}`), "cannot unmarshal number 1e30"},
		{"fd with hello", func(f fake) error { return f.sendFD(`{"op":"hello","version":1,"pid":7}`) }, "sent 1 file descriptor(s)"},
		{"no hello", func(fake) error { return nil }, "no hello within"},
		{"silence on spawn", hello, "no answer to spawn 1 within"},
		{"started pid 0", then(hello, answers(`{"op":"started","id":%d,"pid":0}`)), "started 1: pid 0 is outside"},
		{"started pid huge", then(hello, answers(`{"op":"started","id":%d,"pid":99999999}`)), "pid 99999999 is outside"},
		{"started for unknown id", then(hello, sends(`{"op":"started","id":42,"pid":5}`)), "spawn id 42, which is not waiting"},
		{"started twice", then(hello, answers(started, started)), "not waiting"},
		{"exit code 300", then(hello, answers(started, `{"op":"exited","id":%d,"code":300,"signal":0}`)), "exit code 300 is outside 0..255"},
		{"signal 65", then(hello, answers(started, `{"op":"exited","id":%d,"code":193,"signal":65}`)), "signal 65 is outside 0..64"},
		{"code and signal disagree", then(hello, answers(started, `{"op":"exited","id":%d,"code":3,"signal":9}`)), "want 137"},
		{"exit without code", then(hello, answers(started, `{"op":"exited","id":%d}`)), "code and signal are required"},
		{"exited for unknown id", then(hello, sends(`{"op":"exited","id":42,"code":0,"signal":0}`)), "exited for id 42"},
		{"resized unasked", then(hello, sends(`{"op":"resized","id":1}`)), "resized for id 1, which has no resize waiting"},
		{"failed text too long", then(hello, answers(`{"op":"failed","id":%d,"error":"`+strings.Repeat("x", 2000)+`"}`)), "error text must be 1..1024 bytes"},
		{"failed text empty", then(hello, answers(`{"op":"failed","id":%d,"error":""}`)), "error text"},
		{"unknown op", then(hello, sends(`{"op":"spawn","id":1,"argv":["sh"]}`)), `unknown op "spawn"`},
		{"fd after hello", then(hello, func(f fake) error { return f.sendFD(`{"op":"exited","id":1,"code":0,"signal":0}`) }), "file descriptor"},
		{"ends inside a frame", then(hello, func(f fake) error {
			if _, err := f.spawnID(); err != nil {
				return err
			}
			if err := f.raw([]byte{0, 0, 0, 9, '{'}); err != nil {
				return err
			}
			return f.c.CloseWrite()
		}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := hostile(t, tc.script)
			var pe *ProtocolError
			switch {
			case tc.want == "" && !errors.Is(err, ErrAgentLost):
				t.Errorf("got %v, want ErrAgentLost", err)
			case tc.want != "" && (!errors.As(err, &pe) || !strings.Contains(pe.Reason, tc.want)):
				t.Errorf("got %v, want a ProtocolError with %q", err, tc.want)
			}
			if n := openCopies("/etc/passwd"); n > 0 {
				t.Errorf("the host kept %d descriptor(s) the agent sent", n)
			}
		})
	}
}

// hostile runs script as the agent and the host as far as it goes
// (accept, spawn, wait), and returns the host's error. The fake must see
// its connection dropped.
func hostile(t *testing.T, script func(fake) error) error {
	t.Helper()
	l, err := Listen(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.timeout = time.Second
	fakeDone := make(chan error, 1)
	go func() { fakeDone <- runFake(filepath.Join(l.dir.Name(), SocketName), script) }()
	hostErr := host(l)
	select {
	case err := <-fakeDone:
		if err != nil {
			t.Errorf("fake agent: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the host did not drop the fake agent's connection")
	}
	return hostErr
}

// runFake dials, plays script, and waits for the host to close.
func runFake(sock string, script func(fake) error) error {
	c, err := dial(sock)
	if err != nil {
		return err
	}
	defer c.Close()
	// The host may drop the connection before the script is done.
	if err := script(fake{c}); err != nil && !errors.Is(err, unix.EPIPE) && !errors.Is(err, unix.ECONNRESET) {
		return err
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err = io.Copy(io.Discard, c); errors.Is(err, unix.ECONNRESET) {
		return nil
	}
	return err
}

func host(l *Listener) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"true"}})
	if err == nil {
		_, err = p.Wait(ctx)
	}
	select {
	case <-c.Done():
	default:
		return fmt.Errorf("%v, and Done is not closed", err)
	}
	if !errors.Is(c.Err(), err) {
		return fmt.Errorf("%v, but Err says %v", err, c.Err())
	}
	return err
}

// openCopies counts this process's descriptors open on path.
func openCopies(path string) int {
	entries, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range entries {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target == path {
			n++
		}
	}
	return n
}

// TestSpawnAbandoned: a Spawn whose ctx ends before the answer returns
// ctx's error, and the process the agent starts after all is killed; its
// exit is taken quietly.
func TestSpawnAbandoned(t *testing.T) {
	dir := t.TempDir()
	l, err := Listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	abandoned, exitSent := make(chan struct{}), make(chan struct{})
	fakeDone := make(chan error, 1)
	go func() {
		fakeDone <- runFake(filepath.Join(dir, SocketName), func(f fake) error {
			defer close(exitSent)
			if err := f.hello(); err != nil {
				return err
			}
			id, err := f.spawnID()
			if err != nil {
				return err
			}
			<-abandoned
			if err := f.send(fmt.Sprintf(`{"op":"started","id":%d,"pid":4242}`, id)); err != nil {
				return err
			}
			if got, err := f.readJSON(); err != nil || got != fmt.Sprintf(`{"op":"signal","id":%d,"signal":9}`, id) {
				return fmt.Errorf("after the abandoned start: %s, %v; want a SIGKILL", got, err)
			}
			return f.send(fmt.Sprintf(`{"op":"exited","id":%d,"code":137,"signal":9}`, id))
		})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := c.Spawn(short, SpawnRequest{Argv: []string{"true"}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Spawn: %v, want its ctx's error", err)
	}
	close(abandoned)
	// The started process was tracked (the SIGKILL came after it was) until
	// its exit, which is no violation.
	<-exitSent
	deadline := time.Now().Add(5 * time.Second)
	for tracked(c) != 0 || c.Err() != nil {
		if time.Now().After(deadline) || c.Err() != nil {
			t.Fatalf("the abandoned process's exit: %d tracked, connection error %v", tracked(c), c.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Close()
	if err := <-fakeDone; err != nil {
		t.Error(err)
	}
}

// tracked is the number of processes c waits for.
func tracked(c *Conn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.procs)
}
