package dialout

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// CheckURL checks a --connect URL: ws or wss, a host, no credentials or
// token in it (URLs end up in logs and proxies' access logs), and wss
// unless the host is a loopback address, since the token travels in a
// header.
func CheckURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("--connect %q: %v", raw, err)
	}
	if u.User != nil {
		return "", errors.New("--connect: the URL must not carry credentials; give the token with --token-file or BOXRT_CONTROL_TOKEN (sent as Authorization: Bearer)")
	}
	for k := range u.Query() {
		if strings.Contains(strings.ToLower(k), "token") || strings.EqualFold(k, "key") {
			return "", errors.New("--connect: the URL must not carry a token; give it with --token-file or BOXRT_CONTROL_TOKEN (sent as Authorization: Bearer)")
		}
	}
	if u.Host == "" {
		return "", fmt.Errorf("--connect %q: no host; use wss://HOST/PATH", raw)
	}
	switch u.Scheme {
	case "wss":
	case "ws":
		if !loopbackHost(u.Hostname()) {
			return "", fmt.Errorf("--connect %q: ws:// sends the token in clear; use wss:// (ws:// is for loopback hosts only)", raw)
		}
	default:
		return "", fmt.Errorf("--connect %q: scheme %q: use wss:// (or ws:// to a loopback host)", raw, u.Scheme)
	}
	u.Fragment = ""
	return u.String(), nil
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
