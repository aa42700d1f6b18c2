package kube

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var (
	_ backends.Suspender      = (*Backend)(nil)
	_ backends.SuspendChecker = (*Backend)(nil)
)

// AnnSuspended marks a suspended session's PersistentVolumeClaim (the time
// it was suspended). The claim then also carries the Pod's session
// annotations (sessionAnnotations), so that any replica, or a restarted
// boxrt, can report the session and recreate its Pod from the API server
// alone.
const AnnSuspended = "boxrt/suspended"

// sessionAnnotations are the Pod annotations a suspended session's claim
// keeps.
var sessionAnnotations = []string{AnnInstance, AnnSession, AnnSpec, AnnSpecHash, AnnCreated, AnnLastUsed}

// CanSuspend implements backends.SuspendChecker: only a persistent
// session's workspace (its PersistentVolumeClaim) outlives the Pod; an
// emptyDir workspace would be lost, so such sessions are never suspended
// (the runtime's idle policy destroys them instead).
func (b *Backend) CanSuspend(info backends.Session) bool { return info.Persistent }

// Suspend implements backends.Suspender: the session's claim is marked
// (with everything needed to recreate the Pod), then the Pod is deleted.
// The claim and the NetworkPolicy stay. What the Pod held outside the
// workspace (/tmp, changes to a writable root filesystem) is lost. A crash
// between the two steps leaves a marked claim beside a running Pod: Adopt
// reports the session running (the Pod is the truth) and the next Suspend
// or Resume rewrites or clears the mark.
func (b *Backend) Suspend(ctx context.Context, info backends.Session) error {
	if b.configErr != nil {
		return b.configErr
	}
	if !b.CanSuspend(info) {
		return boxerr.Failure("kube backend: session %s cannot be suspended: its workspace is an emptyDir, which is deleted with its Pod; only persistent sessions (workspace on a PersistentVolumeClaim) can be", info.SessionID).
			With("session_id", info.SessionID).With("reason", "not_persistent")
	}
	name := info.BackendSessionID
	pod, err := b.pods().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if pvc, err := b.suspendedClaim(ctx, info); err == nil && pvc.Annotations[AnnSuspended] != "" {
			return nil // another replica suspended it already
		}
		return boxerr.SessionNotFound(info.SessionID).With("reason", "pod gone")
	}
	if err != nil {
		return b.apiError("reading Pod "+name, err)
	}
	if _, err := b.infoFromPod(pod); err != nil {
		return boxerr.Failure("kube backend: Pod %s is not a boxrt session of this instance: %v", name, err).Wrap(err)
	}
	ann := map[string]any{AnnSuspended: time.Now().UTC().Format(time.RFC3339Nano)}
	for _, k := range sessionAnnotations {
		ann[k] = pod.Annotations[k]
	}
	if used, err := time.Parse(time.RFC3339Nano, pod.Annotations[AnnLastUsed]); err != nil || info.LastUsedAt.After(used) {
		// The Pod's annotation is throttled; the runtime knows better.
		ann[AnnLastUsed] = info.LastUsedAt.UTC().Format(time.RFC3339Nano)
	}
	if err := b.annotateClaim(ctx, name, ann); err != nil {
		return err
	}
	b.deletePodOnly(ctx, name)
	b.forgetTouch(name)
	return b.waitGone(ctx, name)
}

// Resume implements backends.Suspender: the Pod is recreated from the
// spec recorded on the claim, with the same claim as its workspace; once
// it runs the mark is cleared. A claim without a mark was resumed by
// another replica: its Pod is waited for.
func (b *Backend) Resume(ctx context.Context, info backends.Session) error {
	if b.configErr != nil {
		return b.configErr
	}
	name := info.BackendSessionID
	pvc, err := b.suspendedClaim(ctx, info)
	if err != nil {
		return err
	}
	if pvc.Annotations[AnnSuspended] == "" {
		return b.waitRunning(ctx, name)
	}
	if _, err := b.podFromClaim(ctx, pvc); err != nil {
		return err
	}
	clear := map[string]any{AnnSuspended: nil}
	for _, k := range sessionAnnotations {
		clear[k] = nil
	}
	return b.annotateClaim(ctx, name, clear)
}

// podFromClaim starts the Pod of the suspended session whose claim is pvc
// and waits for it to run; a Pod that does not come up is deleted again
// (the claim is kept). It returns the session as recorded.
func (b *Backend) podFromClaim(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (backends.Session, error) {
	name := pvc.Name
	stored, err := b.infoFromMeta("PersistentVolumeClaim "+name, name, pvc.Annotations)
	if err != nil {
		return backends.Session{}, boxerr.Failure("kube backend: suspended session's claim %s is unreadable: %v", name, err).Wrap(err)
	}
	pod, err := b.podFor(stored)
	if err != nil {
		return backends.Session{}, err
	}
	// A session suspended by an earlier boxrt has no /tmp claim yet.
	if _, err := b.ensureClaims(ctx, stored); err != nil {
		return backends.Session{}, err
	}
	b.legacy.Delete(name)
	if _, err := b.createPod(ctx, pod, "session "+stored.SessionID); err != nil {
		return backends.Session{}, err
	}
	if err := b.waitRunning(ctx, name); err != nil {
		b.deletePodOnly(ctx, name)
		return backends.Session{}, err
	}
	// A new Pod: a new agent, which is no restart.
	b.noAgent.Delete(name)
	b.closeAgent(name)
	b.warmAgent(name)
	return stored, nil
}

// suspendedClaim reads the session's claim, refusing one of another
// instance.
func (b *Backend) suspendedClaim(ctx context.Context, info backends.Session) (*corev1.PersistentVolumeClaim, error) {
	name := info.BackendSessionID
	pvc, err := b.pvcs().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, boxerr.SessionNotFound(info.SessionID).With("reason", "claim gone")
	}
	if err != nil {
		return nil, b.apiError("reading PersistentVolumeClaim "+name, err)
	}
	if pvc.Labels[LabelInstance] != b.instanceL {
		return nil, boxerr.Failure("kube backend: PersistentVolumeClaim %s does not belong to this boxrt instance", name)
	}
	return pvc, nil
}

// annotateClaim merges ann into the claim's annotations (nil deletes).
func (b *Backend) annotateClaim(ctx context.Context, name string, ann map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return boxerr.Failure("kube backend error: encoding annotations: %v", err).Wrap(err)
	}
	_, err = b.pvcs().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return b.apiError("annotating PersistentVolumeClaim "+name, err)
	}
	return nil
}

// deletePodOnly deletes the session's Pod, keeping its claim and policy;
// a failure shows up in the wait that follows.
func (b *Backend) deletePodOnly(ctx context.Context, name string) {
	b.closeAgent(name)
	ctx, cancel := cleanupContext(ctx, cleanupTimeout)
	defer cancel()
	grace := int64(1)
	_ = b.pods().Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
}

// suspendedClaims lists this instance's marked claims by Pod name.
func (b *Backend) suspendedClaims(ctx context.Context) (map[string]*corev1.PersistentVolumeClaim, error) {
	list, err := b.pvcs().List(ctx, metav1.ListOptions{LabelSelector: b.selector()})
	if err != nil {
		return nil, b.apiError("listing PersistentVolumeClaims", err)
	}
	out := map[string]*corev1.PersistentVolumeClaim{}
	for i := range list.Items {
		c := &list.Items[i]
		if c.Annotations[AnnSuspended] != "" && c.DeletionTimestamp == nil {
			out[c.Name] = c
		}
	}
	return out, nil
}

// adoptSuspended adds to out, with State suspended, every suspended
// session whose Pod out does not already report running, and marks all of
// them live so their claims and policies are kept.
func (b *Backend) adoptSuspended(out []backends.Session, suspended map[string]*corev1.PersistentVolumeClaim, live map[string]bool, problems *[]string) []backends.Session {
	running := map[string]bool{}
	for _, s := range out {
		running[s.BackendSessionID] = true
	}
	names := make([]string, 0, len(suspended))
	for name := range suspended {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		live[name] = true
		if running[name] {
			continue
		}
		info, err := b.infoFromMeta("PersistentVolumeClaim "+name, name, suspended[name].Annotations)
		if err != nil {
			*problems = append(*problems, err.Error())
			continue
		}
		info.State = backends.StateSuspended
		out = append(out, info)
	}
	return out
}
