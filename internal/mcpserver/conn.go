package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// conn is what boxrt keeps of one MCP connection: its default session and
// the sessions it owns, deleted when the connection ends.
type conn struct {
	defaultID string

	mu sync.Mutex
	// ready: the default session was created (by this connection).
	ready bool
	owned map[string]bool
}

// connOf returns the state of ss's connection, making it on its first tool
// call; a goroutine deletes its sessions once the connection ends.
func (s *Server) connOf(ss *mcp.ServerSession) (*conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.conns[ss]; c != nil {
		return c, nil
	}
	if s.closing {
		return nil, boxerr.RuntimeUnavailable("boxrt is shutting down")
	}
	c := &conn{defaultID: newSessionID(), owned: map[string]bool{}}
	s.conns[ss] = c
	s.ended.Add(1)
	go func() {
		defer s.ended.Done()
		_ = ss.Wait()
		s.mu.Lock()
		delete(s.conns, ss)
		s.mu.Unlock()
		s.deleteOwned(c)
	}()
	return c, nil
}

// newSessionID names a session boxrt makes for a connection.
func newSessionID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "mcp-" + hex.EncodeToString(b[:])
}

// session returns the session a tool call works in: the one it names, or
// the connection's default, created on first use (file tools need it to
// exist; a command would create it anyway).
func (s *Server) session(ctx context.Context, req *mcp.CallToolRequest, named string) (string, error) {
	if named = strings.TrimSpace(named); named != "" {
		return named, nil
	}
	c, err := s.connOf(req.Session)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ready {
		if err := s.call(ctx, "box_create_session", map[string]any{"session_id": c.defaultID}, nil); err != nil {
			return "", err
		}
		c.ready, c.owned[c.defaultID] = true, true
	}
	return c.defaultID, nil
}

// own marks a session the connection made as one to delete when it ends.
func (s *Server) own(req *mcp.CallToolRequest, id string) error {
	c, err := s.connOf(req.Session)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.owned[id] = true
	c.mu.Unlock()
	return nil
}

// forget is called when a session was deleted by a tool: the connection
// no longer deletes it, and its default is made again on the next use.
func (s *Server) forget(req *mcp.CallToolRequest, id string) {
	c, err := s.connOf(req.Session)
	if err != nil {
		return
	}
	c.mu.Lock()
	delete(c.owned, id)
	if id == c.defaultID {
		c.ready = false
	}
	c.mu.Unlock()
}

// deleteOwned deletes the sessions of a connection that ended.
func (s *Server) deleteOwned(c *conn) {
	c.mu.Lock()
	ids := make([]string, 0, len(c.owned))
	for id := range c.owned {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
		err := s.call(ctx, "box_delete_session", map[string]any{"session_id": id}, nil)
		cancel()
		switch {
		case err == nil:
			s.log.Debug().Str("session_id", id).Msg("MCP connection ended: its session deleted")
		case !errors.Is(err, boxerr.ErrSessionNotFound):
			s.log.Warn().Err(err).Str("session_id", id).Msg("MCP connection ended: cannot delete its session")
		}
	}
}
