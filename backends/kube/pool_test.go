package kube_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/kube"
)

// pooled starts a pooled Pod as the runtime's pool loop does: under a
// placeholder session id.
func pooled(t *testing.T, b *kube.Backend, n int) backends.Session {
	t.Helper()
	s := spec(fmt.Sprintf("%stest-%d-%s", backends.PoolSessionPrefix, n, randomID()))
	info := start(t, b, s)
	if !strings.HasPrefix(info.BackendSessionID, "boxrt-pool-") {
		t.Fatalf("pooled Pod %s: want a boxrt-pool- name", info.BackendSessionID)
	}
	return info
}

// claimOrStart is the runtime's startSandbox: a claim, and on failure the
// pooled sandbox stopped and a cold start.
func claimOrStart(ctx context.Context, b *kube.Backend, pool backends.Session, s backends.SandboxSpec) (backends.Session, bool, error) {
	if pool.BackendSessionID != "" {
		got, err := b.Claim(ctx, pool, s)
		if err == nil {
			return got, true, nil
		}
		_ = b.StopSession(ctx, pool)
	}
	got, err := b.StartSession(ctx, s)
	return got, false, err
}

// sessionPods lists the running Pods that carry session id.
func sessionPods(t *testing.T, instance, id string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := admin.CoreV1().Pods(testNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: kube.LabelManaged + "=true," + kube.LabelInstance + "=" + kube.InstanceLabel(instance)})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.Annotations[kube.AnnSession] == id && p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	return out
}

// TestPoolClaim: two pooled Pods serve two sessions and a third is cold;
// claimed sessions exec and keep files; another replica creating a claimed
// session gets the claimed Pod; a restarted replica adopts the claimed
// sessions under their ids and the unclaimed pooled Pod under its
// placeholder; a placeholder's stop never deletes a claimed Pod; deletes
// leave nothing (checked by newBackend's cleanup: Pods, claims, policies,
// index ConfigMaps).
func TestPoolClaim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	a := newBackend(t, "")
	pools := []backends.Session{pooled(t, a, 1), pooled(t, a, 2), pooled(t, a, 3)}
	var infos []backends.Session
	for i := range 3 {
		s := spec(fmt.Sprintf("pool-%d-%s", i, randomID()))
		var pool backends.Session
		if i < 2 {
			pool = pools[i]
		}
		info, fromPool, err := claimOrStart(ctx, a, pool, s)
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		t.Cleanup(func() { _ = a.StopSession(context.Background(), info) })
		if fromPool != (i < 2) || (i < 2) != strings.HasPrefix(info.BackendSessionID, "boxrt-pool-") {
			t.Errorf("session %d: from pool %v, Pod %s; want the first two from the pool", i, fromPool, info.BackendSessionID)
		}
		if info.SessionID != s.SessionID {
			t.Errorf("session %d: id %q, want %q", i, info.SessionID, s.SessionID)
		}
		mustRun(t, a, info, "echo kept-"+s.SessionID+" > /workspace/f")
		if got := mustRun(t, a, info, "cat /workspace/f"); got != "kept-"+s.SessionID {
			t.Errorf("session %d: file holds %q", i, got)
		}
		infos = append(infos, info)
	}

	// A persistent session is never served from the pool.
	persistent := spec("pool-persistent")
	persistent.Persistent = true
	if a.CanClaim(persistent) {
		t.Error("CanClaim accepts a persistent session")
	}

	// Another replica asked for a claimed session serves the claimed Pod.
	b := newBackend(t, a.InstanceID())
	s0 := spec(infos[0].SessionID)
	again, err := b.StartSession(ctx, s0)
	if err != nil {
		t.Fatalf("second replica's create of a claimed session: %v", err)
	}
	if again.BackendSessionID != infos[0].BackendSessionID {
		t.Errorf("second replica got Pod %s, want the claimed %s", again.BackendSessionID, infos[0].BackendSessionID)
	}
	if got := sessionPods(t, a.InstanceID(), s0.SessionID); len(got) != 1 {
		t.Errorf("Pods serving %s: %v, want one", s0.SessionID, got)
	}

	// A restarted replica: claimed sessions under their ids, the unclaimed
	// pooled Pod under its placeholder.
	adopted, err := b.Adopt(ctx)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	byID := map[string]backends.Session{}
	for _, s := range adopted {
		byID[s.SessionID] = s
	}
	for _, want := range append(infos, pools[2]) {
		if got, ok := byID[want.SessionID]; !ok || got.BackendSessionID != want.BackendSessionID {
			t.Errorf("Adopt: %s → %+v, want Pod %s (adopted: %d)", want.SessionID, got, want.BackendSessionID, len(adopted))
		}
	}
	if len(adopted) != 4 {
		t.Errorf("Adopt reported %d sessions, want 4", len(adopted))
	}
	if got := mustRun(t, b, byID[infos[1].SessionID], "cat /workspace/f"); got != "kept-"+infos[1].SessionID {
		t.Errorf("adopted claimed session's file holds %q", got)
	}

	// Stopping a placeholder whose Pod was claimed leaves the session.
	if err := b.StopSession(ctx, pools[0]); err != nil {
		t.Errorf("stopping a claimed placeholder: %v", err)
	}
	if !b.Alive(ctx, infos[0]) {
		t.Error("stopping the placeholder of a claimed Pod killed the session")
	}
	// The unclaimed one goes, as the runtime's adopt does it.
	if err := b.StopSession(ctx, pools[2]); err != nil {
		t.Errorf("stopping an unclaimed pooled Pod: %v", err)
	}

	// A claimed session deletes cleanly, index included, and its id can
	// be created again (cold).
	if err := a.StopSession(ctx, infos[0]); err != nil {
		t.Fatalf("StopSession: %v", err)
	}
	indexes := 0
	for _, o := range objects(t, a.InstanceID()) {
		if strings.HasSuffix(o, "/"+infos[0].BackendSessionID) {
			t.Errorf("left after deleting claimed session %s: %s", infos[0].SessionID, o)
		}
		if strings.HasPrefix(o, "configmap/") {
			indexes++
		}
	}
	if indexes != 1 {
		t.Errorf("%d index ConfigMaps after deleting one of two claimed sessions, want 1", indexes)
	}
	cold := start(t, a, s0)
	if strings.HasPrefix(cold.BackendSessionID, "boxrt-pool-") {
		t.Errorf("recreated session got pooled Pod %s", cold.BackendSessionID)
	}

	// A claim for a session that has its Pod gives up; the pooled Pod it
	// took meanwhile is deleted, its index dropped, the session's Pod kept.
	late := pooled(t, a, 4)
	if _, err := a.Claim(ctx, late, s0); err == nil || !strings.Contains(err.Error(), "already has Pod "+cold.BackendSessionID) {
		t.Errorf("claim for a session with a Pod: %v, want \"already has Pod %s\"", err, cold.BackendSessionID)
	}
	if got := sessionPods(t, a.InstanceID(), s0.SessionID); len(got) != 1 || got[0] != cold.BackendSessionID {
		t.Errorf("Pods serving %s after the refused claim: %v, want only %s", s0.SessionID, got, cold.BackendSessionID)
	}
	if p, err := admin.CoreV1().Pods(testNamespace).Get(ctx, late.BackendSessionID, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
		t.Errorf("pooled Pod %s taken by the refused claim is still there", late.BackendSessionID)
	}
	if slices.Contains(objects(t, a.InstanceID()), "configmap/"+cold.BackendSessionID) {
		t.Errorf("the refused claim left its index configmap/%s", cold.BackendSessionID)
	}
}

// TestPoolClaimRace: two replicas of one installation, each with a pooled
// Pod, create the same session at once (claim against claim, claim
// against cold create): exactly one Pod serves it, both get that Pod.
func TestPoolClaimRace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	a := newBackend(t, "")
	b := newBackend(t, a.InstanceID())
	for round, mode := range []string{"claim-claim", "claim-cold", "cold-claim", "claim-claim"} {
		s := spec(fmt.Sprintf("pool-race-%d-%s", round, randomID()))
		replicas := []*kube.Backend{a, b}
		var pools [2]backends.Session
		for i, r := range replicas {
			if strings.Split(mode, "-")[i] == "claim" {
				pools[i] = pooled(t, r, round*2+i)
			}
		}
		var infos [2]backends.Session
		var errs [2]error
		var wg sync.WaitGroup
		for i, r := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				infos[i], _, errs[i] = claimOrStart(ctx, r, pools[i], s)
			}()
		}
		wg.Wait()
		for i := range replicas {
			if errs[i] != nil {
				t.Fatalf("%s: replica %d: %v", mode, i, errs[i])
			}
		}
		t.Cleanup(func() { _ = a.StopSession(context.Background(), infos[0]) })
		if infos[0].BackendSessionID != infos[1].BackendSessionID {
			t.Errorf("%s: replicas got Pods %s and %s", mode, infos[0].BackendSessionID, infos[1].BackendSessionID)
		}
		if got := sessionPods(t, a.InstanceID(), s.SessionID); len(got) != 1 {
			t.Errorf("%s: Pods serving %s: %v, want exactly one", mode, s.SessionID, got)
		}
		mustRun(t, b, infos[0], "echo "+mode+" > /workspace/f")
		if got := mustRun(t, a, infos[1], "cat /workspace/f"); got != mode {
			t.Errorf("%s: the replicas see different files: %q", mode, got)
		}
		if err := a.StopSession(ctx, infos[0]); err != nil {
			t.Errorf("%s: StopSession: %v", mode, err)
		}
	}
}
