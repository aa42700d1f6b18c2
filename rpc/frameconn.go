package rpc

import "context"

// FrameConn is a message transport the caller brings (a dial-out
// runtime's logical connection): ReadFrame returns whole messages, the
// frame valid until the next call, and an error once the connection has
// ended; WriteFrame sends one message.
type FrameConn interface {
	ReadFrame() ([]byte, error)
	WriteFrame([]byte) error
	Close() error
}

// ServeFrames serves one connection on fc until ReadFrame fails or ctx
// ends; transport is what TransportFrom reports to handlers.
func (s *Server) ServeFrames(ctx context.Context, fc FrameConn, transport string) {
	s.serve(ctx, unbuffered{fc}, transport)
}

// unbuffered is a FrameConn that writes each frame at once.
type unbuffered struct{ FrameConn }

func (unbuffered) More() bool   { return false }
func (unbuffered) Flush() error { return nil }
