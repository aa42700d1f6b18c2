package rpc

import (
	"net/http/httptest"
	"testing"
)

func TestHostGuard(t *testing.T) {
	tests := []struct {
		name, listen string
		extra        []string
		host, origin string
		allowed      bool
	}{
		{"loopback listener, IP host", "127.0.0.1:5410", nil, "127.0.0.1:5410", "", true},
		{"loopback listener, localhost", "127.0.0.1:5410", nil, "localhost:5410", "", true},
		{"loopback listener, other loopback IP", "127.0.0.1:5410", nil, "127.0.0.2", "", true},
		{"loopback listener, IPv6 loopback", "127.0.0.1:5410", nil, "[::1]:5410", "", true},
		{"loopback listener, rebinding name", "127.0.0.1:5410", nil, "evil.example:5410", "", false},
		{"loopback listener, LAN IP", "127.0.0.1:5410", nil, "10.1.2.3:5410", "", false},
		{"loopback listener, empty host", "127.0.0.1:5410", nil, "", "", false},
		{"loopback listener, trailing dot and case", "127.0.0.1:5410", nil, "LOCALHOST.:5410", "", true},
		{"loopback listener, loopback origin", "127.0.0.1:5410", nil, "127.0.0.1:5410", "http://localhost:3000", true},
		{"loopback listener, foreign origin", "127.0.0.1:5410", nil, "127.0.0.1:5410", "http://evil.example", false},
		{"loopback listener, null origin", "127.0.0.1:5410", nil, "127.0.0.1:5410", "null", false},
		{"specific listener, its host", "10.1.2.3:5410", nil, "10.1.2.3:5410", "", true},
		{"specific listener, loopback not served", "10.1.2.3:5410", nil, "127.0.0.1:5410", "", false},
		{"allow-listed proxy name", "127.0.0.1:5410", []string{"Box.Internal"}, "box.internal", "https://box.internal", true},
		{"wildcard listener, loopback", "0.0.0.0:5410", nil, "127.0.0.1:5410", "", true},
		{"wildcard listener, foreign name", "0.0.0.0:5410", nil, "evil.example", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewHostGuard(tc.listen, tc.extra)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/healthz", nil)
			r.Host = tc.host
			if tc.origin != "" {
				r.Header.Set("Origin", tc.origin)
			}
			if why := g.Check(r); (why == "") != tc.allowed {
				t.Fatalf("allowed=%v, want %v (%s)", why == "", tc.allowed, why)
			}
		})
	}
}

func TestTokenMatches(t *testing.T) {
	tests := []struct {
		name    string
		offered []string
		want    string
		ok      bool
	}{
		{"match", []string{"abc"}, "abc", true},
		{"one of several", []string{"x", "abc"}, "abc", true},
		{"none offered", nil, "abc", false},
		{"empty want never matches", []string{""}, "", false},
		{"prefix is not a match", []string{"ab"}, "abc", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var offered [][]byte
			for _, o := range tc.offered {
				offered = append(offered, []byte(o))
			}
			if got := TokenMatches(offered, []byte(tc.want)); got != tc.ok {
				t.Fatalf("got %v, want %v", got, tc.ok)
			}
		})
	}
}
