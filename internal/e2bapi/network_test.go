package e2bapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/boxrt/boxrt/backends"
)

func TestPolicyOf(t *testing.T) {
	no, yes := false, true
	tests := []struct {
		name          string
		body          string // the network object, "" for none
		allowInternet *bool
		want          backends.NetworkMode
		set           bool
		err           string
	}{
		{name: "nothing: boxrt's default"},
		{name: "internet on, nothing denied", allowInternet: &yes, want: backends.NetworkOn, set: true},
		{name: "allowOut alone: nothing is denied", body: `{"allowOut":["pypi.org"]}`, want: backends.NetworkOn, set: true},
		{name: "deny all but allowOut", body: `{"allowOut":["pypi.org","8.8.8.8/32"],"denyOut":["0.0.0.0/0"]}`,
			want: `{"allow":["pypi.org","8.8.8.8/32"]}`, set: true},
		{name: "internet off closes everything", allowInternet: &no, want: `{"allow":[]}`, set: true},
		{name: "internet off with exceptions", body: `{"allowOut":["api.test"]}`, allowInternet: &no, want: `{"allow":["api.test"]}`, set: true},
		{name: "update body's own switch", body: `{"allow_internet_access":false}`, want: `{"allow":[]}`, set: true},
		{name: "part of the internet denied", body: `{"denyOut":["10.0.0.0/8"]}`, err: "denyOut"},
		{name: "transform rules", body: `{"rules":{"api.test":[{}]}}`, err: "rules"},
		{name: "empty rules are none", body: `{"rules":{},"denyOut":["0.0.0.0/0"]}`, want: `{"allow":[]}`, set: true},
		{name: "egress proxy", body: `{"egressProxy":{"address":"p:1080"}}`, err: "egressProxy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var n *e2bNetwork
			if tt.body != "" {
				n = &e2bNetwork{}
				if err := json.Unmarshal([]byte(tt.body), n); err != nil {
					t.Fatal(err)
				}
			}
			got, set, err := policyOf(n, tt.allowInternet)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want one naming %s", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want || set != tt.set {
				t.Errorf("got %q set=%v err=%v, want %q set=%v", got, set, err, tt.want, tt.set)
			}
		})
	}
}
