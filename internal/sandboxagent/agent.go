package sandboxagent

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	_ "github.com/boxrt/boxrt/internal/agentboot" // one processor from the start (MaxThreads)
	"github.com/boxrt/boxrt/internal/fdsafe"
)

// maxBackoff caps the wait between two dials.
const maxBackoff = time.Second

// Main is the agent: `boxrt agent --connect PATH`. It dials PATH (again
// and again, with a backoff capped at 1 s, while the connection is down)
// and serves the host until it is killed. It returns only on a usage error
// (status 2). It is to be started with stdin, stdout and stderr only: a
// descriptor it inherits beyond those stays open in it (boxrt's main has
// marked it close-on-exec, so no child gets it).
//
// Where boxrt reaches the sandbox only through commands it runs there (a
// Pod's exec), `boxrt agent --listen PATH` serves who connects to PATH,
// and `boxrt agent --bridge PATH` is such a command: it joins its stdin
// and stdout to PATH, and the host speaks the protocol (its stream mode,
// streammsg.go) through them. `boxrt agent --version` prints the
// protocol's version: a probe that the binary runs in the sandbox.
func Main(args []string) int {
	fs := flag.NewFlagSet("boxrt agent", flag.ContinueOnError)
	connect := fs.String("connect", "", "the agent socket to dial, as seen inside the sandbox")
	listen := fs.String("listen", "", "the socket to listen on, in the sandbox")
	bridgeTo := fs.String("bridge", "", "the socket of a listening agent to join stdin and stdout to")
	version := fs.Bool("version", false, "print the protocol version")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set := 0
	for _, s := range []string{*connect, *listen, *bridgeTo} {
		if s != "" {
			set++
		}
	}
	switch {
	case *version && set == 0 && fs.NArg() == 0:
		fmt.Println(protocolVersion)
		return 0
	case set != 1 || *version || fs.NArg() > 0:
		fmt.Fprintln(os.Stderr, "boxrt agent: usage: boxrt agent --connect PATH | --listen PATH | --bridge PATH | --version")
		return 2
	case *bridgeTo != "":
		if err := bridge(*bridgeTo); err != nil {
			fmt.Fprintln(os.Stderr, "boxrt agent: "+err.Error())
			return 1
		}
		return 0
	case *listen != "":
		err := newAgent("").listen(*listen)
		fmt.Fprintln(os.Stderr, "boxrt agent: "+err.Error())
		return 1
	}
	newAgent(*connect).run()
	return 0 // not reached: run never returns
}

// RunIfAgent lets a test binary act as the agent: called first in
// TestMain, when os.Args[1] is "agent" it runs Main(os.Args[2:]) and exits.
func RunIfAgent() {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		// What boxrt's main does first, so that a test's agent hands
		// on no descriptor the test binary inherited either.
		if err := fdsafe.Seal(); err != nil {
			fmt.Fprintln(os.Stderr, "boxrt agent: "+err.Error())
			os.Exit(1)
		}
		os.Exit(Main(os.Args[2:]))
	}
}

// agent is the sandbox side. Its children belong to the connection that
// spawned them: a connection's ids mean nothing to the next one (a
// restarted boxrt counts from 1 again), so when a connection drops, its
// children keep running untracked and their exits are reaped silently.
type agent struct {
	path string

	// mu is held across a fork and the recording of its pid, so that the
	// reaper, which takes mu for every status, never sees a tracked
	// child's status before the child is tracked. A listening agent's
	// connections (listen) share it, and the reaper.
	mu *sync.Mutex
	// served: a listening agent's connections, each an agent of its own
	// (under mu); nil for a dialling agent, whose one connection is a's.
	served []*agent
	fc     *frameConn     // the connection, nil while down
	live   map[int]uint64 // pid → id of the connection's running children
	ids    map[uint64]int // id → pid, running or exited, for signals
	gone   []uint64       // exited ids, oldest first, to bound ids
	// streams: the connection's stream-mode processes (stream.go), by
	// id, until their exited is sent.
	streams map[uint64]*streamProc
	// longArgs: arguments sent ahead of their spawn or run (longarg.go),
	// by id.
	longArgs map[uint64][]byte
	// relays: pid → the terminal the agent relays for it, until the
	// process exits (whichever connection spawned it); one map, shared
	// by a listening agent's connections (under mu).
	relays map[int]*relay
	// forked wakes the reaper when it found no child to wait for: a
	// spawn sends on it (without blocking); shared like mu.
	forked chan struct{}
}

func newAgent(path string) *agent {
	// Orphans of the session reparent to the agent, which reaps them,
	// also when it is not the sandbox's PID 1. Without it (a seccomp
	// filter may refuse prctl) they go to the sandbox's init, which reaps
	// them as well: worth a line, not a failure.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "boxrt agent: PR_SET_CHILD_SUBREAPER: %v\n", err)
	}
	a := &agent{path: path, mu: new(sync.Mutex), relays: map[int]*relay{}, forked: make(chan struct{}, 1)}
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	go a.reap(chld)
	makeSpareThreads(spareThreads)
	return a
}

// MaxThreads bounds the agent's threads: the Go runtime's few on one
// processor (agentboot) and the spares (spareThreads), 9 in all, plus a
// margin. A
// backend whose sandbox's pids limit also holds the agent adds it to the
// limit, so the session's commands keep all of theirs.
const MaxThreads = 10

// spareThreads is how many threads the agent makes, idle, before it first
// says hello. The Go runtime keeps idle threads and takes one when a
// goroutine must run while others are blocked in system calls (a fork, a
// stat, the reaper's wait4), so the agent does not need to make one later,
// when the session's commands may hold every pid its limit allows: a host
// sizes that limit by the agent's threads at hello.
const spareThreads = 3

// makeSpareThreads makes n threads and leaves them idle: each goroutine
// locked to its thread while the others are makes the runtime start one
// more; unlocked, they exit and their threads stay.
func makeSpareThreads(n int) {
	var locked sync.WaitGroup
	release := make(chan struct{})
	for range n {
		locked.Add(1)
		go func() {
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
}

// run dials and serves, forever.
func (a *agent) run() {
	backoff := 10 * time.Millisecond
	for {
		c, err := dial(a.path)
		if err != nil {
			time.Sleep(backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		began := time.Now()
		err = a.serve(newFrameConn(c, true))
		fmt.Fprintf(os.Stderr, "boxrt agent: connection ended: %v\n", err)
		// A connection refused at once does not make the agent spin.
		if time.Since(began) > maxBackoff {
			backoff = 10 * time.Millisecond
		}
	}
}

// dial connects to path; a path longer than sun_path is reached through
// its directory's descriptor, held only while connecting.
func dial(path string) (*net.UnixConn, error) {
	if len(path) < len(unix.RawSockaddrUnix{}.Path) {
		return net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	}
	d, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	via := "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + filepath.Base(path)
	return net.DialUnix("unix", nil, &net.UnixAddr{Name: via, Net: "unix"})
}

// serve says hello on fc and serves it until it fails.
func (a *agent) serve(fc *frameConn) error {
	a.mu.Lock()
	a.fc, a.live, a.ids, a.gone = fc, map[int]uint64{}, map[uint64]int{}, nil
	a.streams = map[uint64]*streamProc{}
	err := a.sendLocked(helloMsg{Op: opHello, Version: protocolVersion, PID: os.Getpid()})
	a.mu.Unlock()
	for err == nil {
		var payload []byte
		if payload, err = fc.readFrame(); err == nil {
			err = a.handle(fc, payload)
		}
	}
	a.mu.Lock()
	a.fc, a.live, a.ids, a.gone = nil, nil, nil, nil
	a.longArgs = nil
	streams := a.streams
	a.streams = nil
	a.mu.Unlock()
	for _, sp := range streams {
		sp.orphan()
	}
	fc.dropFDs()
	fc.c.Close()
	if errors.Is(err, io.EOF) {
		return errors.New("boxrt closed it")
	}
	return err
}

// handle takes one frame of the host's. The host is trusted more than the
// agent, but its frames are bounded and checked all the same; a frame that
// breaks the protocol ends the connection.
func (a *agent) handle(fc *frameConn, payload []byte) error {
	op, err := opOf(payload)
	if err != nil {
		return err
	}
	switch op {
	case opSpawn:
		var m spawnMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		n, err := m.descriptors()
		if err != nil {
			return err
		}
		fds, err := fc.claimFDs(n)
		if err != nil {
			return err
		}
		if m.LongArg {
			if err := a.takeLongArg(m.ID, m.Argv); err != nil {
				closeFDs(fds)
				return err
			}
		}
		return a.spawn(&m, fds, nil)
	case opArg:
		var m argMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		return a.addLongArg(&m)
	case opSignal:
		var m signalMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		a.signal(&m)
		return nil
	case opResize:
		var m resizeMsg
		if err := decodeStrict(op, payload, &m); err != nil {
			return err
		}
		return a.resizeTerm(&m)
	case opRun, opInput, opCredit:
		return a.handleStream(fc, op, payload)
	}
	return &ProtocolError{Reason: "unknown op " + short(op)}
}

// sendLocked writes one message; a.mu is held.
func (a *agent) sendLocked(m any) error {
	if a.fc == nil {
		return errors.New("not connected")
	}
	payload, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return a.fc.writeFrame(payload, nil)
}
