package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Warm pools. A pooled Pod is started for a placeholder session id under a
// random name (boxrt-pool-…): replicas number their placeholders alike, so
// a derived name would make two replicas' pools share Pods. Handing it to a
// session cannot rename it, so the session's derived name
// podName(instance, session id), which replicas creating the same session
// race on, is taken instead by an index ConfigMap of that name pointing at
// the claimed Pod. The index is the one object a claim and a cold create
// of the same session both go through:
//
//   - Claim creates the index in state "claiming" (AlreadyExists: another
//     replica is claiming for the session; give up), then, at once, checks
//     that no Pod of the derived name exists and takes the pooled Pod with
//     a resourceVersion-guarded patch (so two replicas never take one Pod);
//     a derived Pod found gives up (the session exists; the Pod taken is
//     deleted). Only then it commits the index ("claimed") with a
//     resourceVersion-guarded patch.
//   - A cold create looks the index up before creating the derived Pod and
//     again once that Pod serves: a committed index wins (the derived Pod is
//     deleted and the claimed one adopted); a "claiming" index is aborted by
//     a resourceVersion-guarded delete, which makes the claim's commit fail.
//
// Each side writes its object before reading the other's, so a claim that
// commits read "no derived Pod" before any such Pod existed, and every
// replica serving a derived Pod reads the index after it existed: exactly
// one Pod serves the session. Adopt reports a claimed Pod only with its
// committed index, and unclaimed pooled Pods under their placeholder ids
// (the runtime removes them; a placeholder's stop only deletes a Pod still
// unclaimed, so it never takes a session from another replica).

// Pooled Pod and index markers.
const (
	// LabelPool is "ready" on an unclaimed pooled Pod, "claimed" once a
	// session owns it.
	LabelPool = "boxrt/pool"
	// AnnPool is a pooled Pod's placeholder session id, kept after a claim.
	AnnPool = "boxrt/pool"

	poolReady   = "ready"
	poolClaimed = "claimed"

	poolPodPrefix = "boxrt-pool-"

	// Index ConfigMap data keys and states.
	indexSession  = "session"
	indexPod      = "pod"
	indexState    = "state"
	indexClaiming = "claiming"
	indexClaimed  = "claimed"
)

var (
	_ backends.Pooler       = (*Backend)(nil)
	_ backends.ClaimChecker = (*Backend)(nil)
)

func isPoolID(sessionID string) bool {
	return strings.HasPrefix(sessionID, backends.PoolSessionPrefix)
}

// nameFor is the Pod name of a new session: derived from the session id,
// random for a pooled Pod.
func (b *Backend) nameFor(sessionID string) string {
	if !isPoolID(sessionID) {
		return podName(b.instance, sessionID)
	}
	buf := make([]byte, 10)
	_, _ = rand.Read(buf)
	return poolPodPrefix + hex.EncodeToString(buf)
}

// markPooled labels a pooled Pod as such before it is created.
func markPooled(pod *corev1.Pod, sessionID string) {
	if isPoolID(sessionID) {
		pod.Labels[LabelPool] = poolReady
		pod.Annotations[AnnPool] = sessionID
	}
}

// nameFits says whether a Pod (or claim) named name may carry session id:
// the derived name, or a pooled Pod's (whose claim Adopt checks against
// the index).
func (b *Backend) nameFits(name, id string, a map[string]string) bool {
	return podName(b.instance, id) == name || (strings.HasPrefix(name, poolPodPrefix) && a[AnnPool] != "")
}

// CanClaim implements backends.ClaimChecker: a pooled Pod's workspace is
// an emptyDir, so it cannot serve a persistent session (whose workspace is
// a PersistentVolumeClaim).
func (b *Backend) CanClaim(spec backends.SandboxSpec) bool {
	return !spec.Persistent && spec.HostPath == "" && len(spec.ExtraMounts) == 0
}

// Claim implements backends.Pooler (the protocol is described above). A
// failure leaves the pooled Pod unclaimed (the runtime stops it) or, once
// taken, deletes it.
func (b *Backend) Claim(ctx context.Context, info backends.Session, spec backends.SandboxSpec) (backends.Session, error) {
	if b.configErr != nil {
		return info, b.configErr
	}
	spec = b.withDefaults(spec)
	if !b.CanClaim(spec) || info.Persistent {
		return info, boxerr.Failure("kube backend: a pooled Pod cannot serve session %s: pooled Pods have an emptyDir workspace and no mapped claims", spec.SessionID)
	}
	name := info.BackendSessionID
	derived := podName(b.instance, spec.SessionID)
	// Each API call is a round trip to a server that may be far away: what
	// the protocol lets run at once does. The pooled Pod is read while the
	// index is created (its patch is guarded by what was read, so the read
	// may come first); the derived Pod is read, after the index exists,
	// while the pooled Pod is taken.
	pooledPod := goRead(func() (*corev1.Pod, error) { return b.unclaimed(ctx, info) })
	idx, err := b.createIndex(ctx, derived, spec.SessionID, name)
	pooled := <-pooledPod
	if apierrors.IsAlreadyExists(err) {
		return info, boxerr.Failure("kube backend: session %s is being created from another replica's pool", spec.SessionID)
	}
	if err != nil {
		return info, b.apiError("creating index ConfigMap "+derived, err)
	}
	claimed := spec.Session(Name, name)
	claimed.CreatedAt = time.Now().UTC()
	claimed.LastUsedAt = claimed.CreatedAt
	hash, raw, err := specHash(claimed.Sandbox)
	if err != nil {
		b.dropIndex(ctx, idx)
		return info, boxerr.Failure("kube backend error: encoding the session spec: %v", err).Wrap(err)
	}
	at := claimed.CreatedAt.Format(time.RFC3339Nano)
	derivedPod := goRead(func() (*corev1.Pod, error) { return b.pods().Get(ctx, derived, metav1.GetOptions{}) })
	err = b.takePooled(ctx, info, pooled, map[string]any{
		"labels": map[string]string{LabelPool: poolClaimed},
		"annotations": map[string]string{AnnSession: spec.SessionID, AnnSpec: string(raw), AnnSpecHash: hash,
			AnnCreated: at, AnnLastUsed: at},
	})
	if derivedErr := b.sessionHasNoPod(<-derivedPod, spec.SessionID, derived); derivedErr != nil || err != nil {
		if err == nil {
			// Taken for nothing: the Pod is this call's alone now.
			b.removeSession(ctx, name)
			err = derivedErr
		}
		b.dropIndex(ctx, idx)
		return info, err
	}
	err = b.patchGuarded(ctx, "configmaps", derived, idx.ResourceVersion, nil, map[string]string{indexState: indexClaimed})
	if err != nil {
		// A create of the same session aborted the claim: the Pod is
		// this call's alone, and no use to anyone now.
		b.removeSession(ctx, name)
		b.dropIndex(ctx, idx)
		return info, boxerr.Failure("kube backend: claiming pooled Pod %s for session %s: %v", name, spec.SessionID, err).Wrap(err)
	}
	return claimed, nil
}

// unclaimed reads the pooled Pod of info, which must still be unclaimed
// and running.
func (b *Backend) unclaimed(ctx context.Context, info backends.Session) (*corev1.Pod, error) {
	name := info.BackendSessionID
	pod, err := b.pods().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, b.apiError("reading pooled Pod "+name, err)
	}
	if pod.Annotations[AnnSession] != info.SessionID || !podRunning(pod) {
		return nil, boxerr.Failure("kube backend: pooled Pod %s is no longer available (claimed by another replica, or not running)", name)
	}
	return pod, nil
}

// takePooled patches meta onto the pooled Pod of info provided it is still
// unclaimed, starting from read (unclaimed's answer): each patch is
// guarded by the resourceVersion read with it, so two replicas never both
// take one Pod. A Conflict from some other write (the kubelet's status
// updates) is retried on a fresh read.
func (b *Backend) takePooled(ctx context.Context, info backends.Session, read podRead, meta map[string]any) error {
	for attempt := 0; ; attempt++ {
		if read.err != nil {
			return read.err
		}
		err := b.patchGuarded(ctx, "pods", read.pod.Name, read.pod.ResourceVersion, meta, nil)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 3 {
			return b.apiError("claiming pooled Pod "+read.pod.Name, err)
		}
		read.pod, read.err = b.unclaimed(ctx, info)
	}
}

// sessionHasNoPod checks the read of a session's derived Pod: a claim
// must not go on when one exists.
func (b *Backend) sessionHasNoPod(read podRead, id, derived string) error {
	if read.err == nil && read.pod.DeletionTimestamp == nil {
		return boxerr.Failure("kube backend: session %s already has Pod %s", id, derived)
	}
	if ignoreNotFound(read.err) != nil {
		return b.apiError("reading Pod "+derived, read.err)
	}
	return nil
}

// podRead is the outcome of reading a Pod.
type podRead struct {
	pod *corev1.Pod
	err error
}

// goRead reads a Pod on its own goroutine; the channel yields the outcome
// once, and the goroutine ends whether or not anybody receives it.
func goRead(read func() (*corev1.Pod, error)) <-chan podRead {
	ch := make(chan podRead, 1)
	go func() {
		pod, err := read()
		ch <- podRead{pod, err}
	}()
	return ch
}

// withDefaults fills the spec fields StartSession and Claim default.
func (b *Backend) withDefaults(spec backends.SandboxSpec) backends.SandboxSpec {
	if spec.MountPath == "" {
		spec.MountPath = backends.DefaultMountPath
	}
	if spec.Image == "" {
		spec.Image = b.cfg.Image
	}
	return spec
}

// patchGuarded merge-patches metadata (and a ConfigMap's data) of object
// name, provided its resourceVersion is still rv: a Conflict says another
// writer came first.
func (b *Backend) patchGuarded(ctx context.Context, resource, name, rv string, meta map[string]any, data map[string]string) error {
	if meta == nil {
		meta = map[string]any{}
	}
	meta["resourceVersion"] = rv
	body := map[string]any{"metadata": meta}
	if data != nil {
		body["data"] = data
	}
	patch, err := json.Marshal(body)
	if err != nil {
		return err
	}
	if resource == "pods" {
		_, err = b.pods().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	} else {
		_, err = b.configMaps().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	return err
}

// createIndex creates the "claiming" index of session id (named derived)
// pointing at Pod pod.
func (b *Backend) createIndex(ctx context.Context, derived, id, pod string) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: derived, Namespace: b.ns, Labels: b.labels(pod)},
		Data:       map[string]string{indexSession: id, indexPod: pod, indexState: indexClaiming},
	}
	return b.configMaps().Create(ctx, cm, metav1.CreateOptions{})
}

// deleteIndex deletes the index cm provided it has not changed since it
// was read (nil: it is gone); a Conflict says it has.
func (b *Backend) deleteIndex(ctx context.Context, cm *corev1.ConfigMap) error {
	rv := cm.ResourceVersion
	err := b.configMaps().Delete(ctx, cm.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	return ignoreNotFound(err)
}

// dropIndex is deleteIndex on a cleanup path, where failures are left to
// Adopt's garbage collection.
func (b *Backend) dropIndex(ctx context.Context, cm *corev1.ConfigMap) {
	ctx, cancel := cleanupContext(ctx, cleanupTimeout)
	defer cancel()
	_ = b.deleteIndex(ctx, cm)
}

// claimedSession looks for a committed claim of want's session: found, it
// adopts the claimed Pod (ok true). A claim in progress is aborted, and an
// index whose Pod is gone or no longer the session's is removed: the
// caller then serves the session with the Pod of the derived name.
func (b *Backend) claimedSession(ctx context.Context, want backends.Session) (got backends.Session, ok bool, err error) {
	if isPoolID(want.SessionID) {
		return backends.Session{}, false, nil
	}
	derived := podName(b.instance, want.SessionID)
	for attempt := 0; attempt < 3; attempt++ {
		cm, err := b.configMaps().Get(ctx, derived, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return backends.Session{}, false, nil
		}
		if err != nil {
			return backends.Session{}, false, b.apiError("reading index ConfigMap "+derived, err)
		}
		var pod *corev1.Pod
		if cm.Data[indexState] == indexClaimed && cm.Data[indexSession] == want.SessionID {
			pod, err = b.pods().Get(ctx, cm.Data[indexPod], metav1.GetOptions{})
			if ignoreNotFound(err) != nil {
				return backends.Session{}, false, b.apiError("reading Pod "+cm.Data[indexPod], err)
			}
		}
		if pod != nil && err == nil && pod.DeletionTimestamp == nil && pod.Annotations[AnnSession] == want.SessionID {
			got, err := b.adoptCreated(ctx, pod, want)
			return got, true, err
		}
		switch err := b.deleteIndex(ctx, cm); {
		case err == nil:
			return backends.Session{}, false, nil
		case !apierrors.IsConflict(err):
			return backends.Session{}, false, b.apiError("deleting index ConfigMap "+derived, err)
		}
		// The claim committed (or the index changed) meanwhile: read again.
	}
	return backends.Session{}, false, boxerr.Failure("kube backend: the index of session %s keeps changing", want.SessionID)
}

// settle ends a create that serves info's Pod of the derived name: a claim
// of a pooled Pod for the same session that committed meanwhile wins, and
// the derived Pod goes.
func (b *Backend) settle(ctx context.Context, info backends.Session) (backends.Session, error) {
	got, ok, err := b.claimedSession(ctx, info)
	if err != nil {
		return backends.Session{}, err
	}
	if !ok {
		return info, nil
	}
	b.removeSession(ctx, info.BackendSessionID)
	return got, nil
}

// stopPooled deletes an unclaimed pooled Pod (and its policy); one a
// session claimed meanwhile (another replica's, maybe) is that session's
// now and is left alone.
func (b *Backend) stopPooled(ctx context.Context, info backends.Session) error {
	name := info.BackendSessionID
	pods := b.pods()
	for attempt := 0; ; attempt++ {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if err != nil {
			return b.apiError("reading pooled Pod "+name, err)
		}
		if pod.Annotations[AnnSession] != info.SessionID {
			return nil
		}
		grace := int64(1)
		rv := pod.ResourceVersion
		err = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if err == nil || apierrors.IsNotFound(err) {
			break
		}
		if !apierrors.IsConflict(err) || attempt >= 3 {
			return b.apiError("deleting pooled Pod "+name, err)
		}
	}
	if err := b.deleteAll(ctx, name); err != nil {
		return err
	}
	b.forgetTouch(name)
	return b.waitGone(ctx, name)
}

// dropClaimIndex deletes the index of a claimed session whose Pod is gone.
func (b *Backend) dropClaimIndex(ctx context.Context, info backends.Session) {
	derived := podName(b.instance, info.SessionID)
	if derived == info.BackendSessionID {
		return
	}
	cm, err := b.configMaps().Get(ctx, derived, metav1.GetOptions{})
	if err == nil && cm.Data[indexPod] == info.BackendSessionID {
		b.dropIndex(ctx, cm)
	}
}

// indexes lists this instance's index ConfigMaps by name.
func (b *Backend) indexes(ctx context.Context) (map[string]*corev1.ConfigMap, error) {
	list, err := b.configMaps().List(ctx, metav1.ListOptions{LabelSelector: b.selector()})
	if err != nil {
		return nil, b.apiError("listing index ConfigMaps", err)
	}
	out := make(map[string]*corev1.ConfigMap, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// adoptable says whether Adopt may report the session info read from pod:
// an unclaimed pooled Pod may (under its placeholder id), a claimed one
// only with its committed index, and a Pod of the derived name only while
// no committed claim of the same session points elsewhere (a crash while
// it was yielding to one).
func (b *Backend) adoptable(pod *corev1.Pod, info backends.Session, idx map[string]*corev1.ConfigMap) bool {
	if isPoolID(info.SessionID) {
		return true
	}
	cm := idx[podName(b.instance, info.SessionID)]
	committed := cm != nil && cm.Data[indexState] == indexClaimed && cm.Data[indexSession] == info.SessionID
	if pod.Annotations[AnnPool] != "" {
		return committed && cm.Data[indexPod] == pod.Name
	}
	return !committed || cm.Data[indexPod] == pod.Name
}

// collectIndexes deletes stale index ConfigMaps whose Pod is gone or whose
// claim never committed.
func (b *Backend) collectIndexes(ctx context.Context, idx map[string]*corev1.ConfigMap, live map[string]bool, problems *[]string) {
	for _, cm := range idx {
		stale := time.Since(cm.CreationTimestamp.Time) > staleAfter && cm.DeletionTimestamp == nil
		if stale && (!live[cm.Data[indexPod]] || cm.Data[indexState] != indexClaimed) {
			if err := b.deleteIndex(ctx, cm); err != nil && !apierrors.IsConflict(err) {
				*problems = append(*problems, b.apiError("deleting index ConfigMap "+cm.Name, err).Error())
			}
		}
	}
}
