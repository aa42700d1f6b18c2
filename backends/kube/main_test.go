package kube_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/kube"
	"github.com/boxrt/boxrt/internal/sandboxagent/agenttest"
)

// testImage is built by scripts/build-test-image (static busybox, USER
// 1000) and copied into the test cluster's containerd by scripts/kube-up.
const testImage = "boxrt-test:busybox"

// testNamespace holds every test Pod; each test uses its own instance id,
// so tests never see each other's sessions.
const testNamespace = "boxrt-kube-test"

var (
	// setupErr is why the cluster is unusable; every test fails with it
	// rather than skipping.
	setupErr   error
	kubeconfig string
	admin      kubernetes.Interface
	adminRC    *rest.Config
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Fprintln(os.Stderr, "\n!!! -short: SKIPPING every Kubernetes integration test in backends/kube !!!")
	} else if setupErr = setup(); setupErr != nil {
		fmt.Fprintf(os.Stderr, "\n!!! backends/kube: Kubernetes integration tests cannot run: %v !!!\n\n", setupErr)
	}
	// client-go starts process-lifetime goroutines (client certificate
	// rotation, connection readers) that are not leaks of the backend.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("k8s.io/client-go/transport.(*dynamicClientCert).runWorker"),
		goleak.IgnoreTopFunction("k8s.io/client-go/transport.(*dynamicClientCert).Run"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.PollImmediateUntil"),
		goleak.IgnoreTopFunction("k8s.io/apimachinery/pkg/util/wait.PollImmediateUntilWithContext.poller.func1.1"),
		goleak.IgnoreTopFunction("k8s.io/client-go/util/workqueue.(*delayingType[...]).waitingLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		// A WebSocket exec stream cut by its context (a file read closed
		// early) leaves its ping loop until the next ping fails on the
		// closed connection, up to one ping period later.
		goleak.IgnoreTopFunction("k8s.io/client-go/tools/remotecommand.(*heartbeat).start"),
		// A SPDY exec stream whose connection's close fails (the API
		// server closed it first) hands that error to a channel nobody
		// reads, for up to ten minutes (spdystream's Connection.shutdown).
		goleak.IgnoreTopFunction("github.com/moby/spdystream.(*Connection).shutdown"),
	)
}

// setup finds the test cluster: $BOXRT_TEST_KUBECONFIG (scripts/test sets
// it), else scripts/kube-up is run (idempotent; it builds the cluster on a
// fresh machine) and its last line names the kubeconfig.
func setup() error {
	kubeconfig = os.Getenv("BOXRT_TEST_KUBECONFIG")
	if kubeconfig == "" {
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "kube-up")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, script).Output()
		if err != nil {
			return fmt.Errorf("%s failed: %v", script, err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		last := lines[len(lines)-1]
		var ok bool
		if kubeconfig, ok = strings.CutPrefix(last, "KUBECONFIG="); !ok {
			return fmt.Errorf("%s did not end with KUBECONFIG=<path>: %q", script, last)
		}
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	adminRC = rc
	admin, err = kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", testNamespace, err)
	}
	return nil
}

func needCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: Kubernetes integration test")
	}
	if setupErr != nil {
		t.Fatalf("test cluster unusable: %v", setupErr)
	}
}

func randomID() string {
	buf := make([]byte, 6)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

// newBackend builds a backend on the test cluster with a fresh instance id
// (or the given one, to play a second replica of the same installation).
func newBackend(t *testing.T, instance string, mutate ...func(*kube.Config)) *kube.Backend {
	t.Helper()
	needCluster(t)
	if instance == "" {
		instance = "test-" + randomID()
		t.Cleanup(func() { assertNothingLeft(t, instance) })
	}
	cfg := kube.Config{
		InstanceID:      instance,
		Kubeconfig:      kubeconfig,
		Namespace:       testNamespace,
		Image:           testImage,
		ImagePullPolicy: "Never",
		AgentBinary:     agenttest.Binary(t),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	b, err := kube.New(cfg)
	if err != nil {
		t.Fatalf("kube.New: %v", err)
	}
	return b
}

func spec(id string) backends.SandboxSpec {
	s := backends.DefaultSandboxSpec()
	s.SessionID = id
	s.Image = testImage
	s.CPUs = 0.5
	s.MemoryMB = 64
	return s
}

func start(t *testing.T, b *kube.Backend, s backends.SandboxSpec) backends.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	info, err := b.StartSession(ctx, s)
	if err != nil {
		t.Fatalf("StartSession(%s): %v", s.SessionID, err)
	}
	t.Cleanup(func() { _ = b.StopSession(context.Background(), info) })
	return info
}

type result struct {
	stdout, stderr string
	backends.ExitStatus
}

func run(t *testing.T, b *kube.Backend, info backends.Session, req backends.ExecRequest) (result, error) {
	t.Helper()
	var out, errb bytes.Buffer
	req.Stdout, req.Stderr = &out, &errb
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := b.Exec(ctx, info, req)
	return result{out.String(), errb.String(), st}, err
}

func mustRun(t *testing.T, b *kube.Backend, info backends.Session, cmd string) string {
	t.Helper()
	r, err := run(t, b, info, backends.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", cmd, r.ExitCode, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// objects lists what the instance owns in the namespace (Pods, claims,
// policies and warm-pool index ConfigMaps), as kind/name.
func objects(t *testing.T, instance string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: kube.LabelManaged + "=true," + kube.LabelInstance + "=" + kube.InstanceLabel(instance)}
	var out []string
	pods, err := admin.CoreV1().Pods(testNamespace).List(ctx, sel)
	if err != nil {
		t.Fatalf("listing pods: %v", err)
	}
	for _, p := range pods.Items {
		out = append(out, "pod/"+p.Name)
	}
	pvcs, err := admin.CoreV1().PersistentVolumeClaims(testNamespace).List(ctx, sel)
	if err != nil {
		t.Fatalf("listing pvcs: %v", err)
	}
	for _, p := range pvcs.Items {
		out = append(out, "pvc/"+p.Name)
	}
	nps, err := admin.NetworkingV1().NetworkPolicies(testNamespace).List(ctx, sel)
	if err != nil {
		t.Fatalf("listing networkpolicies: %v", err)
	}
	for _, p := range nps.Items {
		out = append(out, "networkpolicy/"+p.Name)
	}
	cms, err := admin.CoreV1().ConfigMaps(testNamespace).List(ctx, sel)
	if err != nil {
		t.Fatalf("listing configmaps: %v", err)
	}
	for _, c := range cms.Items {
		out = append(out, "configmap/"+c.Name)
	}
	return out
}

// assertNothingLeft waits (PVC deletion finishes after its Pod is gone) for
// the instance to own nothing in the cluster.
func assertNothingLeft(t *testing.T, instance string) {
	t.Helper()
	if setupErr != nil {
		return
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		left := objects(t, instance)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left in the cluster after the test: %v", left)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// upload writes data to path inside the session's Pod through the exec
// subresource (the test's stand-in for kubectl cp).
func upload(t *testing.T, pod, path string, data []byte) {
	t.Helper()
	req := admin.CoreV1().RESTClient().Post().Namespace(testNamespace).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: "sandbox", Command: []string{"sh", "-c", `cat >"$1" && chmod +x "$1"`, "upload", path},
			Stdin: true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(adminRC, "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: bytes.NewReader(data), Stdout: io.Discard, Stderr: &out}); err != nil {
		t.Fatalf("upload %s: %v: %s", path, err, out.String())
	}
}
