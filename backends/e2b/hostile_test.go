package e2b

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/filesystem"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/filesystem/filesystemconnect"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process/processconnect"
)

// These tests face the backend with a hostile endpoint (a fake on
// loopback that says what a real one must not); the backend's behaviour
// against a real endpoint is test/e2b_backend_test.go's.

func TestMain(m *testing.M) {
	streamIdle, killWait = 2*time.Second, time.Second
	goleak.VerifyTestMain(m)
}

// hostile is a fake endpoint: control routes and envd on one server.
type hostile struct {
	control func(w http.ResponseWriter, r *http.Request)
	start   func(ctx context.Context, stream *connect.ServerStream[process.StartResponse]) error
	files   func(w http.ResponseWriter, r *http.Request)
	list    []*filesystem.EntryInfo
	size    int64
}

type fakeProcess struct {
	processconnect.UnimplementedProcessHandler
	h *hostile
}

func (f fakeProcess) Start(ctx context.Context, _ *connect.Request[process.StartRequest], s *connect.ServerStream[process.StartResponse]) error {
	return f.h.start(ctx, s)
}

func (f fakeProcess) SendSignal(context.Context, *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	return connect.NewResponse(&process.SendSignalResponse{}), nil // and ignored
}

type fakeFiles struct {
	filesystemconnect.UnimplementedFilesystemHandler
	h *hostile
}

func (f fakeFiles) Stat(context.Context, *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	return connect.NewResponse(&filesystem.StatResponse{Entry: &filesystem.EntryInfo{Name: "f", Type: filesystem.FileType_FILE_TYPE_FILE, Size: f.h.size}}), nil
}

func (f fakeFiles) ListDir(context.Context, *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: f.h.list}), nil
}

func startEvent(pid uint32) *process.StartResponse {
	return &process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}}
}

func endEvent(code int32, exited bool, status string) *process.StartResponse {
	return &process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: code, Exited: exited, Status: status}}}}
}

func dataEvent(p []byte) *process.StartResponse {
	return &process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: p}}}}}
}

// serve starts h and returns a backend on it and a session whose
// sandbox it knows.
func serve(t *testing.T, h *hostile) (*Backend, backends.Session) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(fakeProcess{h: h}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(fakeFiles{h: h}))
	mux.HandleFunc("/files", func(w http.ResponseWriter, r *http.Request) { h.files(w, r) })
	top := http.NewServeMux()
	top.Handle("/envd/", http.StripPrefix("/envd", mux))
	top.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		if h.control != nil {
			h.control(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"sandboxID":"sb1","envdAccessToken":"tok","state":"running"}`)
	})
	srv := httptest.NewServer(top)
	b, err := New(Config{InstanceID: "t", APIKey: "k", APIURL: srv.URL + "/api", SandboxURL: srv.URL + "/envd"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		srv.CloseClientConnections()
		srv.Close()
	})
	return b, backends.Session{SessionID: "s", BackendName: Name, BackendSessionID: "sb1"}
}

func exec(t *testing.T, b *Backend, info backends.Session, timeout time.Duration) (backends.ExitStatus, string, error) {
	t.Helper()
	var out bytes.Buffer
	st, err := b.Exec(context.Background(), info, backends.ExecRequest{Cmd: "x", Stdout: &out, Stderr: io.Discard, Timeout: timeout})
	return st, out.String(), err
}

func wantKind(t *testing.T, err error, kind *boxerr.Kind, text string) {
	t.Helper()
	var be *boxerr.Error
	if !errors.As(err, &be) || be.Kind != kind || !strings.Contains(err.Error(), text) {
		t.Fatalf("want a %s containing %q, got %T %v", kind.Type, text, err, err)
	}
}

func TestHostileCommandStreams(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(context.Context, *connect.ServerStream[process.StartResponse]) error
		want  string
	}{
		{"no start event", func(_ context.Context, s *connect.ServerStream[process.StartResponse]) error {
			return s.Send(endEvent(0, true, "exit status 0"))
		}, "not its start"},
		{"pid zero", func(_ context.Context, s *connect.ServerStream[process.StartResponse]) error {
			return s.Send(startEvent(0))
		}, "pid 0"},
		{"pid out of range", func(_ context.Context, s *connect.ServerStream[process.StartResponse]) error {
			return s.Send(startEvent(1 << 30))
		}, "pid"},
		{"exit code out of range", func(_ context.Context, s *connect.ServerStream[process.StartResponse]) error {
			_ = s.Send(startEvent(7))
			return s.Send(endEvent(999, true, ""))
		}, "exit code 999"},
		{"no end", func(_ context.Context, s *connect.ServerStream[process.StartResponse]) error {
			return s.Send(startEvent(7))
		}, "without its end"},
		{"started twice", func(_ context.Context, s *connect.ServerStream[process.StartResponse]) error {
			_ = s.Send(startEvent(7))
			return s.Send(startEvent(8))
		}, "twice"},
		{"end without exit code", func(_ context.Context, s *connect.ServerStream[process.StartResponse]) error {
			_ = s.Send(startEvent(7))
			return s.Send(endEvent(0, false, "\x1b[2Jweird"))
		}, "without an exit code"},
		{"oversized message", func(_ context.Context, s *connect.ServerStream[process.StartResponse]) error {
			_ = s.Send(startEvent(7))
			return s.Send(dataEvent(bytes.Repeat([]byte("x"), maxMessage+1)))
		}, "bytes"},
		{"silent stream", func(ctx context.Context, s *connect.ServerStream[process.StartResponse]) error {
			_ = s.Send(startEvent(7))
			<-ctx.Done()
			return nil
		}, "sent nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, info := serve(t, &hostile{start: tc.start})
			_, _, err := exec(t, b, info, time.Minute)
			wantKind(t, err, boxerr.ErrBox, tc.want)
			if strings.ContainsRune(err.Error(), 0x1b) {
				t.Errorf("control characters from envd reached the error: %q", err)
			}
		})
	}
}

func TestTimeoutWhenEnvdIgnoresTheKill(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	b, info := serve(t, &hostile{start: func(ctx context.Context, s *connect.ServerStream[process.StartResponse]) error {
		_ = s.Send(startEvent(7))
		_ = s.Send(dataEvent([]byte("partial")))
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}})
	start := time.Now()
	st, out, err := exec(t, b, info, 500*time.Millisecond)
	if err != nil || !st.TimedOut || out != "partial" {
		t.Fatalf("got %+v %q %v", st, out, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a timed-out exec took %s to return", d)
	}
}

func TestHostileControlAnswers(t *testing.T) {
	spec := backends.DefaultSandboxSpec()
	spec.SessionID = "s"
	for _, tc := range []struct {
		name   string
		status int
		body   string
		kind   *boxerr.Kind
		want   string
	}{
		{"sandbox id with a path", 201, `{"sandboxID":"../x","envdAccessToken":"t"}`, boxerr.ErrBox, "malformed sandbox id"},
		{"token with a newline", 201, `{"sandboxID":"ok","envdAccessToken":"a\nb"}`, boxerr.ErrBox, "malformed envd access token"},
		{"domain with a path", 201, `{"sandboxID":"ok","envdAccessToken":"t","domain":"evil/x"}`, boxerr.ErrBox, "malformed domain"},
		{"not JSON", 201, `<html>`, boxerr.ErrBox, "not the JSON expected"},
		{"oversized", 201, `{"x":"` + strings.Repeat("a", maxControlBody) + `"}`, boxerr.ErrBox, "over"},
		{"wrong key", 401, `{"code":401,"message":"Invalid API key"}`, boxerr.ErrBackendUnavailable, "Invalid API key"},
		{"unknown template", 404, `{"code":404,"message":"template 'x' not found"}`, boxerr.ErrValidation, "template 'x' not found"},
		{"rate limited", 429, `{"code":429,"message":"slow down"}`, boxerr.ErrCapacityExceeded, "slow down"},
		{"server error", 500, strings.Repeat("\x00", 10000), boxerr.ErrBox, "500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := serve(t, &hostile{control: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}})
			_, err := b.StartSession(context.Background(), spec)
			wantKind(t, err, tc.kind, tc.want)
			if len(err.Error()) > 2*maxMessageText {
				t.Errorf("error of %d bytes", len(err.Error()))
			}
		})
	}
}

func TestAliveOnlyFalseWhenTheEndpointSaysSo(t *testing.T) {
	for status, want := range map[int]bool{404: false, 500: true, 200: true} {
		b, info := serve(t, &hostile{control: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, `{"sandboxID":"sb1","state":"running"}`)
		}})
		if got := b.Alive(context.Background(), info); got != want {
			t.Errorf("Alive on %d = %v, want %v", status, got, want)
		}
	}
}

func TestHostileFiles(t *testing.T) {
	t.Run("a download longer than the file", func(t *testing.T) {
		b, info := serve(t, &hostile{size: 4, files: func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "abcdEXTRA-THAT-MUST-NOT-BE-READ")
		}})
		rc, _, err := b.ReadFile(context.Background(), info, "/workspace/f", 1, -1)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		got, _ := io.ReadAll(rc)
		if string(got) != "bcd" {
			t.Fatalf("read %q", got)
		}
	})
	t.Run("a listing outside the directory", func(t *testing.T) {
		b, info := serve(t, &hostile{list: []*filesystem.EntryInfo{{Name: "shadow", Path: "/etc/shadow"}}})
		_, err := b.ListFiles(context.Background(), info, "/workspace", 1, 10)
		wantKind(t, err, boxerr.ErrBox, "not below /workspace")
	})
	t.Run("a refused download", func(t *testing.T) {
		b, info := serve(t, &hostile{files: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotFound)
		}})
		_, _, err := b.ReadFile(context.Background(), info, "/workspace/f", 0, -1)
		if !errors.Is(err, boxerr.ErrFileNotFound) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestConfigRefusals(t *testing.T) {
	for _, c := range []Config{
		{InstanceID: "i", APIKey: ""},
		{InstanceID: "i", APIKey: "k", APIURL: "ftp://x"},
		{InstanceID: "i", APIKey: "k", APIURL: "https://user:pw@x"},
		{InstanceID: "i", APIKey: "k", SandboxURL: "http://x?y=1"},
	} {
		if _, err := New(c); !errors.Is(err, boxerr.ErrValidation) {
			t.Errorf("New(%+v) = %v, want a BoxValidationError", c, err)
		}
	}
	b, err := New(Config{InstanceID: "i", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	spec := backends.DefaultSandboxSpec()
	spec.ExtraMounts = []backends.MountSpec{{HostPath: "/etc", MountPath: "/x", Mode: backends.MountRO}}
	if _, err := b.StartSession(context.Background(), spec); !errors.Is(err, boxerr.ErrValidation) {
		t.Errorf("extra mounts: %v", err)
	}
}
