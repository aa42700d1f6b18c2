// Package logsink owns the path from boxrt's loggers to stderr: a bounded
// ring drained by one writer goroutine, so that a host which stops reading
// boxrt's stderr costs dropped (and counted) log lines, never a stalled
// request. It also routes the standard library's log package and klog
// (client-go) through the same ring. It is a leaf: it imports nothing of
// boxrt.
package logsink
