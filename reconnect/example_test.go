package reconnect_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/boxrt/boxrt/reconnect"
)

// A host that spawns boxrt as its child, replays its configuration on every
// (re)connect, and retries a call only when the error says it may.
func ExampleSpawn() {
	hostConfig := map[string]any{"backend": "auto", "limits": map[string]any{"max_sessions": 64}}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := reconnect.Spawn(ctx,
		reconnect.WithCommand("boxrt", "serve", "--stdio", "--listen", "127.0.0.1:0"),
		reconnect.WithStderr(os.Stderr), // boxrt's JSON logs
		reconnect.WithOnConnect(func(ctx context.Context, c reconnect.Caller) error {
			// Runs before any queued call reaches the new child.
			return c.Call(ctx, "box_init", hostConfig, nil)
		}),
		reconnect.WithOnStateChange(func(s reconnect.State, err error) {
			log.Printf("box runtime: %s %v", s, err)
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var res struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	params := map[string]any{"session_id": "chat-42", "cmd": "python3 -c 'print(6*7)'", "timeout_sec": 60}
	for attempt := 1; ; attempt++ {
		callCtx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		err = c.Call(callCtx, "box_exec", params, &res)
		cancel()
		var e *reconnect.Error
		// A lost link is retryable, but the command may already have run:
		// retry only what is safe to run twice.
		if err == nil || !errors.As(err, &e) || !e.Retryable || attempt == 3 {
			break
		}
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
}

// Dialing a runtime that runs as its own service (boxrt serve --listen).
// Without WithToken the token comes from $BOXRT_CONTROL_TOKEN or, for this
// loopback URL, the one the local boxrt generated in its state directory
// (DiscoverToken); it travels only in the Authorization header.
// (TestRealDialExample runs these steps against the real binary and
// asserts what they print.)
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := reconnect.Dial(ctx, "http://127.0.0.1:5410", // → ws://127.0.0.1:5410/rpc/ws
		reconnect.WithHeartbeat(20*time.Second, 15*time.Second, 3),
		reconnect.WithBackoff(3*time.Second, time.Minute),
		reconnect.WithOnConnect(func(ctx context.Context, c reconnect.Caller) error {
			return c.Call(ctx, "box_init", map[string]any{"backend": "docker"}, nil)
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	res, err := c.Exec(ctx, reconnect.ExecSpec{SessionID: "s1", Cmd: "echo hi"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d: %s", *res.ExitCode, res.Stdout) // exit 0: hi
}

// boxrt's wire errors come back as *reconnect.Error and match the
// sentinels with errors.Is. (TestRealDialExample asserts them against the
// real binary.)
func ExampleError() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := reconnect.Dial(ctx, "http://127.0.0.1:5410")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	_, err = c.GetSession(ctx, "gone")
	switch {
	case errors.Is(err, reconnect.ErrSessionNotFound):
		fmt.Println("no such session; create it")
	case errors.Is(err, reconnect.ErrRuntimeUnavailable):
		fmt.Println("runtime down; try later")
	}
	var e *reconnect.Error
	if errors.As(err, &e) {
		fmt.Println(e.Code, e.Type, e.Retryable) // -32004 BoxSessionNotFoundError false
	}
}

// A host that runs a long command in the background, shows its output as
// it arrives, and picks the stream up again after a reconnect.
func ExampleClient_CallStream() {
	ctx := context.Background()
	c, err := reconnect.Dial(ctx, "ws://127.0.0.1:5410", reconnect.WithToken(os.Getenv("BOXRT_CONTROL_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The callback runs on the link's reader: hand the chunks over.
	chunks := make(chan reconnect.ExecOutput, 256)
	onOutput := func(o reconnect.ExecOutput) { chunks <- o }

	var started struct {
		ExecID string `json:"exec_id"`
	}
	err = c.CallStream(ctx, "box_exec_start", map[string]any{
		"session_id": "build-7", "cmd": "make -j4 all", "stream": true,
	}, &started, onOutput)
	if err != nil {
		log.Fatal(err)
	}
	next := int64(0)
	for o := range chunks {
		switch {
		case o.EOF:
			var res struct {
				ExitCode *int `json:"exit_code"`
			}
			if err := c.Call(ctx, "box_exec_wait", map[string]any{"exec_id": started.ExecID}, &res); err != nil {
				log.Fatal(err)
			}
			fmt.Println("exit code", *res.ExitCode)
			return
		case o.Err != nil:
			// The link dropped; the build goes on. Once the client has
			// reconnected, catch up from the next chunk.
			err := c.CallStream(ctx, "box_exec_attach", map[string]any{"exec_id": started.ExecID, "from_seq": next}, nil, onOutput)
			if err != nil {
				log.Fatal(err)
			}
		default:
			next = o.Seq + 1
			os.Stdout.Write(o.Data)
		}
	}
}
