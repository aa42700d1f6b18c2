package mcpserver

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
)

// Options configure New.
type Options struct {
	// Version is the server's version in the MCP handshake.
	Version string
	Log     zerolog.Logger
}

// Path is where the listener serves MCP's Streamable HTTP transport.
const Path = "/mcp"

// maxToolCalls bounds the tool calls running at once over every
// connection, as rpc.DefaultMaxInFlight bounds a JSON-RPC connection's.
const maxToolCalls = rpc.DefaultMaxInFlight

// httpSessionIdle ends an HTTP client's MCP session (and deletes its
// default sandbox) after this long without a request: the client that
// vanished without its DELETE. The SDK does not count the time a call runs,
// so a long run_command keeps its session; the margin is for a model that
// leaves a background command running between two looks at it.
const httpSessionIdle = 2 * time.Hour

// deleteTimeout bounds deleting a connection's sessions when it ends.
const deleteTimeout = 30 * time.Second

// Server serves the tools over one catalogue handler. It may serve many
// connections (stdio, HTTP sessions) at once.
type Server struct {
	h     rpc.Handler
	mcp   *mcp.Server
	log   zerolog.Logger
	slots chan struct{}

	mu      sync.Mutex
	conns   map[*mcp.ServerSession]*conn
	closing bool
	// ended counts the connections whose sessions are not yet deleted.
	ended sync.WaitGroup
}

// New returns a Server whose tools call h: the tenancy layer around the
// method catalogue, as serve's frame loop calls it.
func New(h rpc.Handler, opts Options) *Server {
	s := &Server{h: h, log: opts.Log, slots: make(chan struct{}, maxToolCalls), conns: map[*mcp.ServerSession]*conn{}}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "boxrt", Version: opts.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
	})
	s.addTools()
	return s
}

// instructions tell a model how the tools fit together.
const instructions = `boxrt runs commands and keeps files in sandboxes (sessions). Without a "session" argument every tool uses this connection's own sandbox, created on first use and deleted when the connection ends. Name a session (create_session with persistent: true, or any session name) to keep work beyond this connection. A command that exits non-zero is reported as an error with its exit code and output.`

// ServeStdio serves one MCP connection on in and out until in ends or ctx
// is done; the connection's sessions are deleted before it returns.
func (s *Server) ServeStdio(ctx context.Context, in io.ReadCloser, out io.WriteCloser) error {
	err := s.mcp.Run(ctx, &mcp.IOTransport{Reader: in, Writer: out, MaxLineLength: rpc.MaxMessageBytes})
	s.ended.Wait()
	return err
}

// HTTPHandler serves MCP's Streamable HTTP transport. The caller puts it
// behind the control token and the Host/Origin guard (which also does the
// SDK's localhost protection, with the operator's allowed hosts). A
// message may be as large as a JSON-RPC one (the SDK's 4 MiB default
// would refuse a write_file the catalogue takes).
func (s *Server) HTTPHandler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{SessionTimeout: httpSessionIdle, DisableLocalhostProtection: true, MaxRequestBodyBytes: rpc.MaxMessageBytes})
}

// Close ends every connection and waits, within ctx, until their default
// sessions are deleted. Tool calls after it are refused.
func (s *Server) Close(ctx context.Context) {
	s.mu.Lock()
	s.closing = true
	open := make([]*mcp.ServerSession, 0, len(s.conns))
	for ss := range s.conns {
		open = append(open, ss)
	}
	s.mu.Unlock()
	for _, ss := range open {
		_ = ss.Close()
	}
	done := make(chan struct{})
	go func() { s.ended.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn().Msg("MCP connections' sessions not all deleted at shutdown")
	}
}

// call sends one request to the catalogue and decodes its result into
// out (when not nil).
func (s *Server) call(ctx context.Context, method string, params any, out any) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return boxerr.Failure("cannot encode %s's params: %v", method, err)
	}
	res, err := s.h.Handle(ctx, &rpc.Request{Method: method, Params: raw})
	if err != nil {
		return err
	}
	if out == nil || len(res) == 0 {
		return nil
	}
	if err := json.Unmarshal(res, out); err != nil {
		return boxerr.Failure("cannot decode %s's result: %v", method, err)
	}
	return nil
}

// slot takes one of the tool calls' places, or refuses when all are taken.
func (s *Server) slot() (release func(), err error) {
	select {
	case s.slots <- struct{}{}:
		return func() { <-s.slots }, nil
	default:
		return nil, boxerr.CapacityExceeded("mcp_tool_calls", maxToolCalls, "%d tool calls are already running; wait for one to end", maxToolCalls)
	}
}
