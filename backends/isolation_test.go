package backends

import (
	"reflect"
	"testing"
)

func TestIsolationReportParse(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want IsolationReport
	}{
		{
			name: "runc container",
			out: "kernel=6.1.0\nCapEff=0000000000000000\nSeccomp=2\nNoNewPrivs=1\nuidmap=0 0 4294967295\nuid=1000\nrootro=1\nnetifs=\n" +
				"memory=100663296\npids=77\n",
			want: IsolationReport{KernelShared: true, KernelRelease: "6.1.0", Seccomp: "filter", NoNewPrivs: true,
				UIDMap: "0 0 4294967295", UID: 1000, CapEff: "0000000000000000", ReadOnlyRoot: true,
				NetworkInterfaces: []string{}, CgroupLimits: []string{"memory", "pids"}},
		},
		{
			name: "gvisor: own kernel, limits outside its view",
			out:  "kernel=4.4.0\nCapEff=00000000a80425fb\nSeccomp=0\nNoNewPrivs=0\nuidmap=0 0 4294967295\nuid=0\nrootro=0\nnetifs=eth0 \n",
			want: IsolationReport{KernelRelease: "4.4.0", Seccomp: "disabled", UIDMap: "0 0 4294967295",
				CapEff: "00000000a80425fb", Capabilities: 14, NetworkInterfaces: []string{"eth0"}, CgroupLimits: []string{}},
		},
		{
			name: "bwrap: a nested user namespace",
			out:  "kernel=6.1.0\nSeccomp=2\nuidmap=0 0 1\nuid=0\nmemory=max\npids=max\n",
			want: IsolationReport{KernelShared: true, KernelRelease: "6.1.0", Seccomp: "filter", UserNamespace: true,
				UIDMap: "0 0 1", NetworkInterfaces: []string{}, CgroupLimits: []string{}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got IsolationReport
			got.parse(tc.out, "6.1.0")
			if got.NetworkInterfaces == nil {
				got.NetworkInterfaces = []string{}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parse:\n got %+v\nwant %+v", got, tc.want)
			}
			if got.Summary() == "" {
				t.Error("empty summary")
			}
		})
	}
}
