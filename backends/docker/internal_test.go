package docker

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
)

func TestContainerName(t *testing.T) {
	valid := regexp.MustCompile(`^boxrt-[a-z0-9_.-]{1,32}-[0-9a-f]{8}$`)
	tests := []struct{ id, wantStem string }{
		{"simple", "simple"},
		{"User/Chat 42", "user-chat-42"},
		{"--x--", "x"},
		{"!!!", "session"},
		{"日本語", "session"},
		{strings.Repeat("a", 40), strings.Repeat("a", 32)},
		{"a.b_c-d", "a.b_c-d"},
	}
	for _, tc := range tests {
		got := containerName(tc.id)
		if !valid.MatchString(got) {
			t.Errorf("containerName(%q) = %q: not a valid name", tc.id, got)
		}
		if stem := strings.TrimPrefix(got[:len(got)-9], "boxrt-"); stem != tc.wantStem {
			t.Errorf("containerName(%q) stem %q, want %q", tc.id, stem, tc.wantStem)
		}
	}
	if a, b := containerName("x"), containerName("x"); a == b {
		t.Error("two sessions with the same id got the same container name")
	}
}

func TestSignalExitCode(t *testing.T) {
	for in, want := range map[int]int{0: 0, 1: 1, 127: 127, 128: 128, 130: -2, 137: -9, 143: -15, 192: -64, 193: 193, 255: 255} {
		if got := signalExitCode(in); got != want {
			t.Errorf("signalExitCode(%d) = %d, want %d", in, got, want)
		}
	}
}

func TestLabelsRoundTrip(t *testing.T) {
	b := &Backend{instance: "inst"}
	spec := backends.DefaultSandboxSpec()
	spec.SessionID = "s 1"
	spec.Image = "img:1"
	spec.HostPath = "/srv/x"
	spec.ExtraMounts = []backends.MountSpec{{HostPath: "/a", MountPath: "/b", Mode: backends.MountRO}}
	spec.Persistent = true
	spec.CPUs = 1.5
	spec.WorkspaceQuotaMB = 9
	info := spec.Session(Name, "boxrt-s-1-00000000")
	info.CreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	labels, err := b.labels(info)
	if err != nil {
		t.Fatal(err)
	}
	// Containers a previous boxrt labelled are adopted from this label:
	// its form may only grow (a label without "isolation" reads as the
	// default level).
	const label = `{"image":"img:1","network":"off","host_path":"/srv/x","host_path_mode":"rw","mount_path":"/workspace",` +
		`"extra_mounts":[{"host_path":"/a","mount_path":"/b","mode":"ro"}],"persistent":true,"cpus":1.5,"memory_mb":512,` +
		`"pids_limit":128,"read_only_rootfs":true,"workspace_quota_mb":9,"isolation":""}`
	if labels[LabelSpec] != label {
		t.Errorf("spec label\n got %s\nwant %s", labels[LabelSpec], label)
	}
	if labels[LabelInstance] != "inst" || labels[LabelManaged] != "true" || labels[LabelSession] != "s 1" {
		t.Fatalf("labels %v", labels)
	}
	got, err := infoFromLabels(info.BackendSessionID, labels)
	if err != nil {
		t.Fatal(err)
	}
	if !got.CreatedAt.Equal(info.CreatedAt) || time.Since(got.LastUsedAt) > time.Minute {
		t.Errorf("times: %v %v", got.CreatedAt, got.LastUsedAt)
	}
	got.CreatedAt, got.LastUsedAt, info.LastUsedAt = info.CreatedAt, time.Time{}, time.Time{}
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(info)
	if string(gj) != string(wj) {
		t.Errorf("round trip:\n got %s\nwant %s", gj, wj)
	}
	if _, err := infoFromLabels("c", map[string]string{LabelSpec: "{"}); err == nil {
		t.Error("bad spec label accepted")
	}
}

func TestStreamOpen(t *testing.T) {
	scenarios := []struct {
		name            string
		peer            func(t *testing.T, peer net.Conn)
		open, known     bool
		notSocket, read bool
	}{
		{name: "a silent open socket is open", open: true, known: true},
		{name: "a socket with output waiting is not a shell waiting for its line",
			peer: func(t *testing.T, peer net.Conn) { mustWrite(t, peer) }, known: true},
		{name: "output already buffered counts the same",
			peer: func(t *testing.T, peer net.Conn) { mustWrite(t, peer) }, read: true, known: true},
		{name: "a socket its peer closed is not open",
			peer: func(t *testing.T, peer net.Conn) { _ = peer.Close() }, known: true},
		{name: "a stream that is not a socket is not known", notSocket: true},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var conn, peer net.Conn
			if sc.notSocket {
				conn, peer = net.Pipe()
			} else {
				conn, peer = unixPair(t)
			}
			defer conn.Close()
			defer peer.Close()
			if sc.peer != nil {
				sc.peer(t, peer)
			}
			hj := types.HijackedResponse{Conn: conn, Reader: bufio.NewReader(conn)}
			if sc.read {
				if _, err := hj.Reader.Peek(1); err != nil {
					t.Fatal(err)
				}
			}
			// The peer's write or close must have reached the socket.
			time.Sleep(10 * time.Millisecond)
			open, known := streamOpen(hj)
			if open != sc.open || known != sc.known {
				t.Fatalf("streamOpen: open %v known %v, want %v %v", open, known, sc.open, sc.known)
			}
		})
	}
}

func mustWrite(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := c.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
}

// unixPair is two connected unix sockets, as the engine's stream is one.
func unixPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// TestSeccompProfile: the profile every container gets allows no
// mode-setting syscall unconditionally (only with S_ISUID and S_ISGID
// clear), makes openat2 ENOSYS and allows socket only for families other
// than AF_VSOCK; clone3 is ENOSYS, except in gVisor's variant, where it is
// allowed (runsc answers any rule's errno as EPERM; its sentry answers
// clone3 ENOSYS itself) and nothing else differs.
func TestSeccompProfile(t *testing.T) {
	for _, gvisor := range []bool{false, true} {
		t.Run(map[bool]string{false: "runc", true: "gvisor"}[gvisor], func(t *testing.T) {
			raw, err := seccompProfile()
			if gvisor {
				raw, err = gvisorSeccompProfile()
			}
			if err != nil {
				t.Fatal(err)
			}
			checkSeccompProfile(t, raw, gvisor)
		})
	}
}

func checkSeccompProfile(t *testing.T, raw []byte, gvisor bool) {
	var p struct {
		DefaultAction string `json:"defaultAction"`
		Syscalls      []struct {
			Names    []string `json:"names"`
			Action   string   `json:"action"`
			ErrnoRet *uint    `json:"errnoRet"`
			Args     []struct {
				Index, Value, ValueTwo uint64
				Op                     string
			} `json:"args"`
			Includes *struct {
				Caps []string `json:"caps"`
			} `json:"includes"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Errorf("default action %s", p.DefaultAction)
	}
	guarded := map[string]bool{"openat2": true, "socket": true, "clone3": true}
	for name := range backends.ModeArgument {
		guarded[name] = true
	}
	seen := map[string]bool{}
	for _, r := range p.Syscalls {
		for _, n := range r.Names {
			if !guarded[n] || r.Includes != nil && len(r.Includes.Caps) > 0 {
				continue
			}
			seen[n] = true
			switch {
			case n == "openat2" || n == "clone3" && !gvisor:
				if r.Action != "SCMP_ACT_ERRNO" || r.ErrnoRet == nil || *r.ErrnoRet != uint(unix.ENOSYS) {
					t.Errorf("%s: %+v, want ENOSYS", n, r)
				}
			case n == "clone3":
				if r.Action != "SCMP_ACT_ALLOW" || len(r.Args) != 0 {
					t.Errorf("clone3 on gVisor: %+v, want allowed", r)
				}
			case r.Action != "SCMP_ACT_ALLOW":
			case len(r.Args) != 1:
				t.Errorf("%s is allowed unconditionally: %+v", n, r)
			case n == "socket":
				if a := r.Args[0]; a.Index != 0 || a.Value != unix.AF_VSOCK || a.Op != "SCMP_CMP_NE" {
					t.Errorf("socket rule %+v, want arg 0 != AF_VSOCK", a)
				}
			default:
				a := r.Args[0]
				if a.Index != uint64(backends.ModeArgument[n]) || a.Value != unix.S_ISUID|unix.S_ISGID || a.ValueTwo != 0 || a.Op != "SCMP_CMP_MASKED_EQ" {
					t.Errorf("%s rule %+v, want mode argument & 06000 == 0", n, a)
				}
			}
		}
	}
	for n := range guarded {
		if !seen[n] {
			t.Errorf("no rule for %s", n)
		}
	}
}

// TestGVisorAgentOff: the agent serves gVisor sessions only when the
// engine registered the runtime with host unix sockets open, however the
// flag is spelled (the last one counts, as in runsc's own parsing).
func TestGVisorAgentOff(t *testing.T) {
	tests := []struct {
		args []string
		open bool
	}{
		{nil, false},
		{[]string{"--oci-seccomp", "--network=host"}, false},
		{[]string{"--oci-seccomp", "--host-uds=open"}, true},
		{[]string{"-host-uds=all"}, true},
		{[]string{"--host-uds", "open"}, true},
		{[]string{"--host-uds=create"}, false},
		{[]string{"--host-uds=none"}, false},
		{[]string{"--host-uds=open", "--host-uds=none"}, false},
		{[]string{"--fsgofer-host-uds"}, true},
		{[]string{"--fsgofer-host-uds=false"}, false},
		{[]string{"--debug-log=/x", "host-uds=open"}, false},
	}
	for _, tc := range tests {
		off := agentOffFor("runsc", map[string][]string{"runsc": tc.args})
		if (off == "") != tc.open {
			t.Errorf("args %q: %q, want open %v", tc.args, off, tc.open)
		}
	}
	if off := agentOffFor("runsc", map[string][]string{"runc": nil}); !strings.Contains(off, "no runtime") {
		t.Errorf("a missing runtime: %q", off)
	}
}
