package main

import (
	"io"
	"net"
	"sync"
)

// spliceRelay is the floor the proxy scenarios hold boxrt's proxies to:
// each connection ln accepts is joined to one dial makes, both ways, by
// io.Copy between the two TCP connections (splice(2), nothing through
// user space) — no HTTP, no policy, no bookkeeping. On one machine the
// extra hop still costs a second pass through the TCP stack and a third
// process on the cores, which no proxy avoids. stop closes ln and the
// open connections and waits for the relay's goroutines.
func spliceRelay(ln net.Listener, dial func() (net.Conn, error)) (stop func()) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = struct{}{}
		} else {
			delete(conns, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				up, err := dial()
				if err != nil {
					return
				}
				defer up.Close()
				track(c, true)
				track(up, true)
				defer track(c, false)
				defer track(up, false)
				done := make(chan struct{})
				go func() { halfCopy(up, c); close(done) }()
				halfCopy(c, up)
				<-done
			}()
		}
	}()
	return func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// halfCopy copies src to dst until EOF and passes the EOF on.
func halfCopy(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
