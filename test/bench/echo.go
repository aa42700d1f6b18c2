package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/test/bench/echopeer"
)

// The ping baseline is a minimal JSON-RPC echo peer: a copy of the bench
// binary executed with -echo-peer, so like boxrt it is a separate process
// behind the same pipes or the same loopback WebSocket, and the same client
// code drives both. It decodes each request's id and answers
// {"jsonrpc":"2.0","id":ID,"result":{}} — nothing else: no method table,
// no concurrency limit, no logging, no metrics (package echopeer).

// runEchoWS serves the echo on ws://127.0.0.1:PORT/rpc/ws and prints the
// address on stdout.
func runEchoWS() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/rpc/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.SetReadLimit(16 << 20)
		defer c.CloseNow()
		ctx := r.Context()
		for {
			_, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if err := c.Write(ctx, websocket.MessageText, echopeer.Reply(msg)); err != nil {
				return
			}
		}
	})
	fmt.Println(ln.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}

// echoPeer is a running echo subprocess.
type echoPeer struct {
	cmd    *exec.Cmd
	rpc    *rpcClient // stdio mode
	addr   string     // ws mode
	exited chan struct{}
}

// startEcho starts an echo peer reached over link (from echoExecutable).
func (b *bench) startEcho(link pingLink) (*echoPeer, error) {
	exe, err := b.echoExecutable()
	if err != nil {
		return nil, err
	}
	return spawnEcho(command(link.oneCPU, exe, "-echo-peer", link.mode()), link)
}

// echoExecutable is the file the echo peers run from: a copy of this
// harness's binary, made once per run. A peer run from
// the harness's own file shares its code pages with the client — the same
// physical memory, so the same cache lines after every context switch —
// and no server a host talks to can: with the caller and the peers on one
// CPU, the harness's own file in boxrt's place measured 0.80–1.15× the
// echo peer, a byte-identical copy 1.16–1.30× (where_time_goes.md).
func (b *bench) echoExecutable() (string, error) {
	b.echoMu.Lock()
	defer b.echoMu.Unlock()
	if b.echoExe != "" {
		return b.echoExe, nil
	}
	exe := filepath.Join(b.workDir, "echo-peer")
	if err := copyExecutable(b.selfBin, exe); err != nil {
		return "", fmt.Errorf("echo peer executable: %w", err)
	}
	b.echoExe = exe
	return exe, nil
}

// copyExecutable copies the file src to dst (mode 0755), through a
// temporary name so dst is never a half-written file.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// spawnEcho starts cmd, an echo peer over stdio or WebSocket (which
// prints its address on stdout), with link's client.
func spawnEcho(cmd *exec.Cmd, link pingLink) (*echoPeer, error) {
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	e := &echoPeer{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(e.exited) }()
	switch link.mode() {
	case "stdio":
		e.rpc = newClient(newLineTransport(stdin, stdout), link.direct)
	case "ws":
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			e.stop()
			return nil, fmt.Errorf("echo peer: %v", err)
		}
		e.addr = strings.TrimSpace(line)
	}
	return e, nil
}

func (e *echoPeer) stop() {
	if e.rpc != nil {
		e.rpc.t.Close()
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(5 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
	}
	if e.rpc != nil {
		e.rpc.Close()
	}
}

func (e *echoPeer) wsURL() string { return "ws://" + e.addr + "/rpc/ws" }

// command is exec.Command, on CPU 0 only when oneCPU: the process and
// every thread it starts (taskset sets the mask before it execs).
func command(oneCPU bool, name string, args ...string) *exec.Cmd {
	if oneCPU {
		return exec.Command("taskset", append([]string{"-c", "0", name}, args...)...)
	}
	return exec.Command(name, args...)
}

// onCPU0 runs fn on a thread of its own that only runs on CPU 0. The
// goroutine never unlocks its thread, so the thread ends with it and no
// other goroutine ever runs pinned.
func onCPU0(fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- fmt.Errorf("pin the calling thread to CPU 0: %w", err)
			return
		}
		fn()
		errc <- nil
	}()
	return <-errc
}
