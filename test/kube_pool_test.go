package test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/boxrt/boxrt/backends/kube"
)

// kubeClient is a client of the test cluster that leaves no goroutine
// behind (TestMain checks): the client certificate is loaded inline (a
// file makes client-go start a process-lifetime reloader) and the
// connections are closed at the end of the test.
func kubeClient(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	tls := &rc.TLSClientConfig
	if tls.CertFile != "" {
		tls.CertData, err = os.ReadFile(tls.CertFile)
		require.NoError(t, err)
		tls.CertFile = ""
	}
	if tls.KeyFile != "" {
		tls.KeyData, err = os.ReadFile(tls.KeyFile)
		require.NoError(t, err)
		tls.KeyFile = ""
	}
	hc, err := rest.HTTPClientFor(rc)
	require.NoError(t, err)
	t.Cleanup(hc.CloseIdleConnections)
	cs, err := kubernetes.NewForConfigAndClient(rc, hc)
	require.NoError(t, err)
	return cs
}

// kubeObjects lists what instance owns in namespace default, as kind/name
// (Pods with their session annotation: pod/<name>=<session>).
func kubeObjects(t *testing.T, cs kubernetes.Interface, instance string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: kube.LabelManaged + "=true," + kube.LabelInstance + "=" + kube.InstanceLabel(instance)}
	var out []string
	pods, err := cs.CoreV1().Pods("default").List(ctx, sel)
	require.NoError(t, err)
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, "pod/"+p.Name+"="+p.Annotations[kube.AnnSession])
		}
	}
	cms, err := cs.CoreV1().ConfigMaps("default").List(ctx, sel)
	require.NoError(t, err)
	for _, c := range cms.Items {
		out = append(out, "configmap/"+c.Name)
	}
	nps, err := cs.NetworkingV1().NetworkPolicies("default").List(ctx, sel)
	require.NoError(t, err)
	for _, n := range nps.Items {
		out = append(out, "networkpolicy/"+n.Name)
	}
	return out
}

// countObjects counts the entries of objs that start with prefix and
// contain part.
func countObjects(objs []string, prefix, part string) int {
	n := 0
	for _, o := range objs {
		if strings.HasPrefix(o, prefix) && strings.Contains(o, part) {
			n++
		}
	}
	return n
}

// waitObjects waits (deletes finish after the call returns) until cond
// holds for the instance's objects, and fails with them if it never does.
func waitObjects(t *testing.T, cs kubernetes.Interface, instance, what string, cond func([]string) bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		objs := kubeObjects(t, cs, instance)
		if cond(objs) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the cluster holds %v", what, objs)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestKubeWarmPool runs the built binary on the kube backend with a warm
// pool of 2: two new sessions come from the pool, the third is cold;
// claimed sessions exec, keep files and delete cleanly; a second replica
// (another state dir, the same instance, its own pool) and the first
// create one session at once and get the same single Pod; after both are
// killed, a restart re-adopts the claimed sessions under their ids,
// removes the pooled Pods the dead replicas left and fills its own; its
// graceful exit leaves nothing.
func TestKubeWarmPool(t *testing.T) {
	kubeconfig := kubeconfigForTests(t)
	cs := kubeClient(t, kubeconfig)
	cfg, instance := kubeTestConfig(t, kubeconfig, "e2e-pool-", map[string]any{
		"durable": map[string]any{"pools": []map[string]any{{"name": "warm", "size": 2, "refill_interval_ms": 600000}}}})
	// The refill waits 10 minutes: no pooled Pod is being created when the
	// replicas are killed (a Pod that has not run yet is not adopted, and
	// would be left for a later start to collect).
	state := t.TempDir()
	opts := Options{Stdio: true, StateDir: state, Config: cfg}
	backendID := func(p *Proc, id string) string {
		var s struct {
			BackendSessionID string `json:"backend_session_id"`
		}
		p.MustCall("box_get_session", map[string]any{"session_id": id}, &s)
		return s.BackendSessionID
	}

	p1 := Start(t, opts)
	waitPoolReady(t, p1, 2)
	ids := []string{"pool-s1", "pool-s2", "pool-s3"}
	pods := map[string]string{}
	for _, id := range ids {
		res := execIn(t, p1, map[string]any{"session_id": id, "cmd": "echo kept-" + id + " > /workspace/f && cat /workspace/f"})
		assert.Equal(t, "kept-"+id+"\n", res.Stdout)
		pods[id] = backendID(p1, id)
	}
	var st poolStatus
	p1.MustCall("box_status", map[string]any{}, &st)
	assert.Equal(t, 2, st.PoolHits, "two sessions came from the pool")
	assert.Equal(t, 1, st.PoolMisses, "the third was created cold")
	assert.True(t, strings.HasPrefix(pods["pool-s1"], "boxrt-pool-"), "pool-s1 on %s", pods["pool-s1"])
	assert.True(t, strings.HasPrefix(pods["pool-s2"], "boxrt-pool-"), "pool-s2 on %s", pods["pool-s2"])
	assert.False(t, strings.HasPrefix(pods["pool-s3"], "boxrt-pool-"), "pool-s3 on %s", pods["pool-s3"])
	res := execIn(t, p1, map[string]any{"session_id": "pool-s1", "cmd": "cat /workspace/f"})
	assert.Equal(t, "kept-pool-s1\n", res.Stdout, "a claimed session keeps its files")

	p1.MustCall("box_delete_session", map[string]any{"session_id": "pool-s2"}, nil)
	waitObjects(t, cs, instance, "a deleted claimed session leaves nothing", func(objs []string) bool {
		return countObjects(objs, "", pods["pool-s2"]) == 0 && countObjects(objs, "configmap/", "") == 1
	})

	// A second replica with its own pool; both create one session at once.
	p2 := Start(t, Options{Stdio: true, Config: cfg})
	waitPoolReady(t, p2, 2)
	var wg sync.WaitGroup
	got := make([]string, 2)
	for i, p := range []*Proc{p1, p2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s struct {
				BackendSessionID string `json:"backend_session_id"`
			}
			if r := p.Call("box_create_session", map[string]any{"session_id": "pool-dup"}, 3*time.Minute); r.Error == nil {
				_ = json.Unmarshal(r.Result, &s)
			} else {
				t.Errorf("replica %d: box_create_session: %v", i+1, r.Error)
			}
			got[i] = s.BackendSessionID
		}()
	}
	wg.Wait()
	assert.Equal(t, got[0], got[1], "both replicas serve the session with one Pod")
	waitObjects(t, cs, instance, "exactly one Pod serves pool-dup", func(objs []string) bool {
		return countObjects(objs, "pod/", "=pool-dup") == 1
	})

	// Both replicas die; a restart adopts the claimed sessions and
	// removes the pooled Pods they left.
	p2.Kill()
	p1.Kill()
	p3 := Start(t, opts)
	assert.Equal(t, pods["pool-s1"], backendID(p3, "pool-s1"), "the claimed Pod, re-adopted under its session id")
	assert.Equal(t, got[0], backendID(p3, "pool-dup"))
	res = execIn(t, p3, map[string]any{"session_id": "pool-s1", "cmd": "cat /workspace/f"})
	assert.Equal(t, "kept-pool-s1\n", res.Stdout)
	waitPoolReady(t, p3, 2)
	waitObjects(t, cs, instance, "the dead replicas' pooled Pods removed, the new pool filled", func(objs []string) bool {
		return countObjects(objs, "pod/", "=__pool__") == 2
	})
	p3.Stop()
	waitObjects(t, cs, instance, "a graceful exit leaves nothing", func(objs []string) bool { return len(objs) == 0 })
}
