package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Labels (selectable, short values) and annotations (the full data) on
// every Pod, PersistentVolumeClaim and NetworkPolicy boxrt creates.
const (
	LabelManaged  = "boxrt/managed"
	LabelInstance = "boxrt/instance" // sha256 of the instance id: ids need not be label values
	LabelPod      = "boxrt/pod"      // the session's Pod name, on all three kinds

	AnnInstance = "boxrt/instance"
	AnnSession  = "boxrt/session"
	AnnSpec     = "boxrt/spec"
	AnnSpecHash = "boxrt/spec-hash"
	AnnCreated  = "boxrt/created"
	AnnLastUsed = "boxrt/last-used"
)

// containerName is the one container of a session Pod.
const containerName = "sandbox"

// staleAfter protects objects another replica may be creating right now
// from Adopt's garbage collection.
const staleAfter = 2 * time.Minute

const (
	cleanupTimeout = 30 * time.Second
	// goneTimeout bounds the wait for a deleted Pod to disappear, so the
	// session id (and so the Pod name) can be used again at once.
	goneTimeout = 60 * time.Second
	// touchEvery throttles the last-used annotation patches.
	touchEvery = 30 * time.Second
)

// podName derives the session's Pod name from the instance and session ids:
// deterministic, so replicas creating the same session collide on the name
// (one create wins, the other adopts), and a DNS label whatever the session
// id is (ids may be 105+ characters of anything).
func podName(instance, sessionID string) string {
	sum := sha256.Sum256([]byte(instance + "\x00" + sessionID))
	return "boxrt-" + hex.EncodeToString(sum[:])[:24]
}

// InstanceLabel is the boxrt/instance label value of an instance id (a
// hash: ids need not be valid label values), for selecting an
// installation's objects, e.g. kubectl get pods -l boxrt/instance=….
func InstanceLabel(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:40]
}

func specHash(sb backends.Sandbox) (string, []byte, error) {
	raw, err := json.Marshal(sb)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])[:32], raw, nil
}

func (b *Backend) labels(name string) map[string]string {
	return map[string]string{LabelManaged: "true", LabelInstance: b.instanceL, LabelPod: name}
}

func (b *Backend) selector() string {
	return LabelManaged + "=true," + LabelInstance + "=" + b.instanceL
}

// StartSession implements backends.Backend: the session's NetworkPolicy
// (network off) and PersistentVolumeClaim (persistent) first, then its Pod,
// then it waits for the Pod to run. A Pod of the same name that already
// exists is another replica's create of the same session: it is adopted.
func (b *Backend) StartSession(ctx context.Context, spec backends.SandboxSpec) (backends.Session, error) {
	if b.configErr != nil {
		return backends.Session{}, b.configErr
	}
	if err := spec.RefuseEgressPolicy("kube"); err != nil {
		return backends.Session{}, err
	}
	if spec.SessionID == "" {
		return backends.Session{}, boxerr.Validation("session_id", "session_id must not be empty")
	}
	spec = b.withDefaults(spec)
	name := b.nameFor(spec.SessionID)
	info := spec.Session(Name, name)
	info.CreatedAt = time.Now().UTC()
	info.LastUsedAt = info.CreatedAt
	pod, err := b.podFor(info)
	if err != nil {
		return backends.Session{}, err
	}
	markPooled(pod, spec.SessionID)
	// A session claimed from a warm pool is served by that Pod (pool.go).
	if got, ok, err := b.claimedSession(ctx, info); ok || err != nil {
		return got, err
	}
	// What this call created, undone when the Pod turns out not to be
	// ours: another replica's Pod of the same session keeps its own
	// policy and claim (a deny-all policy left on a network-on session
	// would cut it off).
	var undo []func(context.Context) error
	rollback := func() {
		ctx, cancel := cleanupContext(ctx, cleanupTimeout)
		defer cancel()
		for _, u := range undo {
			_ = u(ctx)
		}
	}
	if spec.Network != backends.NetworkOn {
		created, err := b.ensureNetworkPolicy(ctx, name)
		if err != nil {
			return backends.Session{}, err
		}
		if created {
			undo = append(undo, func(ctx context.Context) error {
				return b.netpols().Delete(ctx, name, metav1.DeleteOptions{})
			})
		}
	}
	if spec.Persistent {
		created, err := b.ensureClaims(ctx, info)
		undo = append(undo, created...)
		if err != nil {
			rollback()
			return backends.Session{}, err
		}
	}
	existing, err := b.createPod(ctx, pod, "session "+spec.SessionID)
	if err != nil {
		rollback()
		return backends.Session{}, err
	}
	if existing != nil {
		got, err := b.adoptCreated(ctx, existing, info)
		if err != nil {
			rollback()
			return got, err
		}
		return b.settle(ctx, got)
	}
	if err := b.waitRunning(ctx, name); err != nil {
		b.removeSession(ctx, name)
		return backends.Session{}, err
	}
	b.warmAgent(name)
	return b.settle(ctx, info)
}

// createPod creates pod, or returns the live Pod of the same name that
// already exists (another replica's create or resume of the same session).
// A Pod of that name still being deleted is waited out first.
func (b *Backend) createPod(ctx context.Context, pod *corev1.Pod, what string) (*corev1.Pod, error) {
	name := pod.Name
	for attempt := 0; ; attempt++ {
		_, err := b.pods().Create(ctx, pod, metav1.CreateOptions{})
		if err == nil {
			return nil, nil
		}
		if !apierrors.IsAlreadyExists(err) || attempt >= 3 {
			return nil, b.apiError("creating Pod for "+what, err)
		}
		existing, err := b.pods().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, b.apiError("reading Pod "+name, err)
		}
		if existing.DeletionTimestamp == nil {
			return existing, nil
		}
		// A delete of the same session is finishing: wait, then create.
		if err := b.waitGone(ctx, name); err != nil {
			return nil, err
		}
	}
}

// adoptCreated serves a Pod another replica created for the same session,
// once it runs, provided it is the same sandbox.
func (b *Backend) adoptCreated(ctx context.Context, existing *corev1.Pod, want backends.Session) (backends.Session, error) {
	got, err := b.infoFromPod(existing)
	if err != nil {
		return backends.Session{}, boxerr.Failure("kube backend: Pod %s exists but is not a boxrt session of this instance: %v", existing.Name, err).Wrap(err)
	}
	wantHash, _, _ := specHash(want.Sandbox)
	if h := existing.Annotations[AnnSpecHash]; h != wantHash {
		return backends.Session{}, boxerr.SessionConflict(want.SessionID, "spec", h, wantHash)
	}
	if err := b.waitRunning(ctx, existing.Name); err != nil {
		return backends.Session{}, err
	}
	b.noteLegacy(existing)
	return got, nil
}

// podFor renders the session's Pod: hardened, with its limits and volumes.
func (b *Backend) podFor(info backends.Session) (*corev1.Pod, error) {
	hash, raw, err := specHash(info.Sandbox)
	if err != nil {
		return nil, boxerr.Failure("kube backend error: encoding the session spec: %v", err).Wrap(err)
	}
	volumes, mounts, err := b.volumes(info)
	if err != nil {
		return nil, err
	}
	no, yes := false, true
	grace := int64(2)
	uid, gid := b.cfg.RunAsUser, b.cfg.RunAsGroup
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      info.BackendSessionID,
			Namespace: b.ns,
			Labels:    b.labels(info.BackendSessionID),
			Annotations: map[string]string{
				AnnInstance: b.instance,
				AnnSession:  info.SessionID,
				AnnSpec:     string(raw),
				AnnSpecHash: hash,
				AnnCreated:  info.CreatedAt.Format(time.RFC3339Nano),
				AnnLastUsed: info.LastUsedAt.Format(time.RFC3339Nano),
			},
		},
		Spec: corev1.PodSpec{
			// The sandbox's main process only keeps it alive; if it dies
			// the session is gone (Alive says so) rather than silently
			// restarted. The session agent's death is not silent: the
			// container is restarted (its emptyDirs kept, its processes
			// gone) and the next command says restarted.
			RestartPolicy:                 b.restartPolicy(),
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			// The pause process becomes pid 1 and reaps the orphans of
			// killed commands (docker's Init: true does the same).
			ShareProcessNamespace: &yes,
			NodeSelector:          b.cfg.NodeSelector,
			Tolerations:           b.cfg.Tolerations,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &uid,
				RunAsGroup:     &gid,
				FSGroup:        &gid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           info.Image,
				ImagePullPolicy: corev1.PullPolicy(b.cfg.ImagePullPolicy),
				// Command replaces the image's ENTRYPOINT too, so it cannot
				// swallow the keep-alive loop.
				Command: b.mainCommand(),
				SecurityContext: &corev1.SecurityContext{
					Privileged:               &no,
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &info.ReadOnlyRootfs,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				Resources:    b.resources(info.Sandbox),
				VolumeMounts: mounts,
			}},
			Volumes: volumes,
		},
	}
	if b.cfg.RuntimeClass != "" {
		rc := b.cfg.RuntimeClass
		pod.Spec.RuntimeClassName = &rc
	}
	return pod, nil
}

// resources: the spec's CPU and memory as limits; requests are
// RequestPercent of them.
func (b *Backend) resources(sb backends.Sandbox) corev1.ResourceRequirements {
	r := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
	pct := int64(b.cfg.RequestPercent)
	if sb.MemoryMB > 0 {
		limit := int64(sb.MemoryMB) << 20
		r.Limits[corev1.ResourceMemory] = *resource.NewQuantity(limit, resource.BinarySI)
		r.Requests[corev1.ResourceMemory] = *resource.NewQuantity(max(limit*pct/100, 1<<20), resource.BinarySI)
	}
	if sb.CPUs > 0 {
		milli := int64(sb.CPUs * 1000)
		r.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(milli, 1), resource.DecimalSI)
		r.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(milli*pct/100, 1), resource.DecimalSI)
	}
	return r
}

// runVolume is boxrt's own directory in every Pod (pidDir): in memory,
// small, out of the user's directories.
const runVolume = "boxrt-run"

// tmpClaim names a persistent session's /tmp claim, which outlives its Pod
// as the workspace's does.
func tmpClaim(name string) string { return name + "-tmp" }

// volumes: the workspace (emptyDir, the session's PVC, or the claim a
// host path is mapped to), boxrt's run directory, /tmp (unless the
// workspace or an extra mount is there) and the extra mounts (mapped
// claims only).
func (b *Backend) volumes(info backends.Session) ([]corev1.Volume, []corev1.VolumeMount, error) {
	ws := corev1.Volume{Name: "workspace"}
	switch {
	case info.HostPath != "" && info.HostPathMode != backends.MountNone:
		src, err := b.mappedClaim("host_path", info.HostPath, info.HostPathMode)
		if err != nil {
			return nil, nil, err
		}
		ws.VolumeSource = src
	case info.Persistent:
		ws.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: info.BackendSessionID}
	default:
		ed := &corev1.EmptyDirVolumeSource{}
		if info.WorkspaceQuotaMB > 0 {
			q := quantityMB(info.WorkspaceQuotaMB)
			ed.SizeLimit = &q
		}
		ws.EmptyDir = ed
	}
	runSize := resource.MustParse("1Mi")
	volumes := []corev1.Volume{ws, {Name: runVolume, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &runSize},
	}}}
	mounts := []corev1.VolumeMount{
		{Name: "workspace", MountPath: info.MountPath, ReadOnly: info.HostPath != "" && info.HostPathMode == backends.MountRO},
		{Name: runVolume, MountPath: pidDir},
	}
	if b.cfg.AgentBinary != "" {
		volumes = append(volumes, agentVolumeSource())
		mounts = append(mounts, corev1.VolumeMount{Name: agentVolume, MountPath: agentDir})
	}
	if ownTmp(info) {
		volumes = append(volumes, b.tmpVolume(info))
		mounts = append(mounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
	}
	for i, m := range info.ExtraMounts {
		field := fmt.Sprintf("extra_mounts[%d].host_path", i)
		src, err := b.mappedClaim(field, m.HostPath, m.Mode)
		if err != nil {
			return nil, nil, err
		}
		vn := fmt.Sprintf("extra-%d", i)
		volumes = append(volumes, corev1.Volume{Name: vn, VolumeSource: src})
		mounts = append(mounts, corev1.VolumeMount{Name: vn, MountPath: m.MountPath, ReadOnly: m.Mode == backends.MountRO})
	}
	return volumes, mounts, nil
}

// ownTmp reports whether the session gets a /tmp of its own: not when its
// workspace or an extra mount is mounted there.
func ownTmp(info backends.Session) bool {
	if path.Clean(mountPath(info)) == "/tmp" {
		return false
	}
	for _, m := range info.ExtraMounts {
		if path.Clean(m.MountPath) == "/tmp" {
			return false
		}
	}
	return true
}

// tmpVolume is the session's /tmp: for a persistent session its own claim
// (kept across suspend, as the workspace's), else an emptyDir on the
// node's disk, kept for the Pod's life; kube.tmp_size_mb bounds both.
func (b *Backend) tmpVolume(info backends.Session) corev1.Volume {
	if info.Persistent {
		return corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: tmpClaim(info.BackendSessionID)},
		}}
	}
	size := quantityMB(b.cfg.TmpSizeMB)
	return corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size}}}
}

// ensureClaims creates a persistent session's claims (its workspace's and
// its /tmp's) and returns the undo of those this call created.
func (b *Backend) ensureClaims(ctx context.Context, info backends.Session) (undo []func(context.Context) error, err error) {
	name := info.BackendSessionID
	claims := []struct {
		claim  string
		sizeMB int
	}{{name, info.WorkspaceQuotaMB}}
	if ownTmp(info) {
		claims = append(claims, struct {
			claim  string
			sizeMB int
		}{tmpClaim(name), b.cfg.TmpSizeMB})
	}
	for _, c := range claims {
		created, err := b.ensurePVC(ctx, c.claim, name, c.sizeMB)
		if err != nil {
			return undo, err
		}
		if created {
			claim := c.claim
			undo = append(undo, func(ctx context.Context) error {
				return b.pvcs().Delete(ctx, claim, metav1.DeleteOptions{})
			})
		}
	}
	return undo, nil
}

// mappedClaim is the volume a host path stands for: a Pod runs on some node
// of the cluster, not on boxrt's host, so a host path means nothing there
// unless the operator says which claim holds the same data.
func (b *Backend) mappedClaim(field, hostPath string, mode backends.MountMode) (corev1.VolumeSource, error) {
	claim, ok := b.cfg.HostPathClaims[hostPath]
	if !ok {
		return corev1.VolumeSource{}, boxerr.Validation(field,
			"%s %q cannot be mounted by the kube backend: a Pod does not run on boxrt's host; map it to a PersistentVolumeClaim with kube.host_path_claims",
			field, hostPath)
	}
	return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
		ClaimName: claim, ReadOnly: mode == backends.MountRO,
	}}, nil
}

// ensureNetworkPolicy creates the policy that denies the Pod all ingress
// and egress. One that exists already (another replica's) is kept; created
// says whether this call made it.
func (b *Backend) ensureNetworkPolicy(ctx context.Context, name string) (created bool, err error) {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.ns, Labels: b.labels(name)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelPod: name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	_, err = b.netpols().Create(ctx, np, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return false, nil
	}
	if err != nil {
		return false, b.apiError("creating NetworkPolicy "+name, err)
	}
	return true, nil
}

// ensurePVC creates claim name of the session whose Pod is pod (labelled
// so, for the collection of orphans); one that is being deleted (the same
// session id, just deleted) is waited out first; created says whether this
// call made it.
func (b *Backend) ensurePVC(ctx context.Context, name, pod string, quotaMB int) (created bool, err error) {
	if quotaMB <= 0 {
		quotaMB = b.cfg.WorkspaceSizeMB
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.ns, Labels: b.labels(pod)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: quantityMB(quotaMB)}},
		},
	}
	if b.cfg.StorageClass != "" {
		sc := b.cfg.StorageClass
		pvc.Spec.StorageClassName = &sc
	}
	pvcs := b.pvcs()
	for attempt := 0; attempt < 3; attempt++ {
		_, err := pvcs.Create(ctx, pvc, metav1.CreateOptions{})
		if err == nil {
			return true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return false, b.apiError("creating PersistentVolumeClaim "+name, err)
		}
		existing, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return false, b.apiError("reading PersistentVolumeClaim "+name, err)
		}
		if existing.DeletionTimestamp == nil {
			return false, nil
		}
		if err := b.poll(ctx, goneTimeout, "PersistentVolumeClaim "+name+" to be deleted", func() (bool, error) {
			_, err := pvcs.Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), ignoreNotFound(err)
		}); err != nil {
			return false, err
		}
	}
	return false, boxerr.Failure("kube backend error: PersistentVolumeClaim %s keeps being recreated and deleted", name)
}

// waitRunning waits for the Pod's container to run, failing early on what
// will not fix itself (a missing image, a Pod that ended).
func (b *Backend) waitRunning(ctx context.Context, name string) error {
	var last string
	err := b.poll(ctx, b.cfg.StartTimeout, "Pod "+name+" to run", func() (bool, error) {
		pod, err := b.pods().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, b.apiError("reading Pod "+name, err)
		}
		if pod.DeletionTimestamp != nil {
			return false, boxerr.Failure("kube backend: Pod %s was deleted while starting", name)
		}
		switch pod.Status.Phase {
		case corev1.PodFailed, corev1.PodSucceeded:
			return false, boxerr.Failure("kube backend: Pod %s ended while starting (%s: %s)", name, pod.Status.Reason, pod.Status.Message)
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
				last = "not scheduled: " + c.Message
			}
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.State.Running != nil {
				return true, nil
			}
			if w := cs.State.Waiting; w != nil {
				last = w.Reason + ": " + w.Message
				switch w.Reason {
				case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName":
					return false, boxerr.Failure("kube backend: image %q cannot be started on the node (%s); load it into the nodes' container runtime or make it pullable", pod.Spec.Containers[0].Image, last)
				case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
					return false, boxerr.Failure("kube backend: Pod %s cannot start its container (%s)", name, last)
				}
			}
			if t := cs.State.Terminated; t != nil {
				return false, boxerr.Failure("kube backend: Pod %s's container ended while starting (%s, exit %d)", name, t.Reason, t.ExitCode)
			}
		}
		return false, nil
	})
	if errors.Is(err, errTimeout) && last != "" {
		return boxerr.Failure("kube backend: Pod %s did not run within %v (last status: %s)", name, b.cfg.StartTimeout, last).Wrap(err)
	}
	return err
}

var errTimeout = errors.New("timed out")

// poll calls check every 100-500 ms until it reports done, fails, or
// timeout passes.
func (b *Backend) poll(ctx context.Context, timeout time.Duration, what string, check func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	delay := 50 * time.Millisecond
	for {
		done, err := check()
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			return boxerr.Failure("kube backend: timed out after %v waiting for %s", timeout, what).Wrap(errTimeout)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (b *Backend) waitGone(ctx context.Context, name string) error {
	return b.poll(ctx, goneTimeout, "Pod "+name+" to be deleted", func() (bool, error) {
		_, err := b.pods().Get(ctx, name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, b.apiError("reading Pod "+name, err)
		}
		return apierrors.IsNotFound(err), nil
	})
}

func podRunning(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == containerName {
			return cs.State.Running != nil
		}
	}
	return false
}

// Alive implements backends.Backend.
func (b *Backend) Alive(ctx context.Context, info backends.Session) bool {
	if b.configErr != nil {
		return false
	}
	pod, err := b.pods().Get(ctx, info.BackendSessionID, metav1.GetOptions{})
	return err == nil && podRunning(pod)
}

// StopSession implements backends.Backend: the Pod, its claim and its
// policy go; it returns once the Pod is gone, so the session id can be
// created again at once.
func (b *Backend) StopSession(ctx context.Context, info backends.Session) error {
	if b.configErr != nil {
		return b.configErr
	}
	ctx, cancel := cleanupContext(ctx, cleanupTimeout+goneTimeout)
	defer cancel()
	if isPoolID(info.SessionID) {
		return b.stopPooled(ctx, info)
	}
	name := info.BackendSessionID
	if err := b.deleteAll(ctx, name); err != nil {
		return err
	}
	b.forgetTouch(name)
	b.legacy.Delete(name)
	if err := b.waitGone(ctx, name); err != nil {
		return err
	}
	b.dropClaimIndex(ctx, info)
	return nil
}

// deleteAll deletes the session's Pod, claims and NetworkPolicy; a missing
// one is fine.
func (b *Backend) deleteAll(ctx context.Context, name string) error {
	b.closeAgent(name)
	grace := int64(1)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &grace}
	if err := b.pods().Delete(ctx, name, opts); ignoreNotFound(err) != nil {
		return b.apiError("deleting Pod "+name, err)
	}
	if err := b.netpols().Delete(ctx, name, metav1.DeleteOptions{}); ignoreNotFound(err) != nil {
		return b.apiError("deleting NetworkPolicy "+name, err)
	}
	for _, claim := range []string{name, tmpClaim(name)} {
		if err := b.pvcs().Delete(ctx, claim, metav1.DeleteOptions{}); ignoreNotFound(err) != nil {
			return b.apiError("deleting PersistentVolumeClaim "+claim, err)
		}
	}
	return nil
}

// removeSession is deleteAll on the cleanup path of a failed create, where
// the create's own error is what the caller gets.
func (b *Backend) removeSession(ctx context.Context, name string) {
	ctx, cancel := cleanupContext(ctx, cleanupTimeout)
	defer cancel()
	_ = b.deleteAll(ctx, name)
}

// infoFromPod rebuilds a Session from a Pod's annotations alone.
func (b *Backend) infoFromPod(pod *corev1.Pod) (backends.Session, error) {
	return b.infoFromMeta("pod "+pod.Name, pod.Name, pod.Annotations)
}

// infoFromMeta rebuilds a Session from the annotations of the object what
// (a Pod, or a suspended session's claim) of the session whose Pod is name.
func (b *Backend) infoFromMeta(what, name string, a map[string]string) (backends.Session, error) {
	if a[AnnInstance] != b.instance {
		return backends.Session{}, fmt.Errorf("%s: instance %q, not %q", what, a[AnnInstance], b.instance)
	}
	id := a[AnnSession]
	if id == "" || !b.nameFits(name, id, a) {
		return backends.Session{}, fmt.Errorf("%s: session annotation %q does not match its name", what, id)
	}
	var sb backends.Sandbox
	if err := json.Unmarshal([]byte(a[AnnSpec]), &sb); err != nil {
		return backends.Session{}, fmt.Errorf("%s: bad %s annotation: %w", what, AnnSpec, err)
	}
	created, err := time.Parse(time.RFC3339Nano, a[AnnCreated])
	if err != nil {
		return backends.Session{}, fmt.Errorf("%s: bad %s annotation: %w", what, AnnCreated, err)
	}
	used, err := time.Parse(time.RFC3339Nano, a[AnnLastUsed])
	if err != nil {
		used = created
	}
	return backends.Session{
		SessionID:        id,
		BackendName:      Name,
		BackendSessionID: name,
		Sandbox:          sb,
		CreatedAt:        created,
		LastUsedAt:       used,
	}, nil
}

// Adopt implements backends.Backend: every running session Pod of this
// instance in the namespace, whichever replica created it. Pods that ended
// are deleted with their claims and policies, and so are claims and
// policies left without a Pod, except a suspended session's (reported with
// State suspended, see suspend.go); anything younger than staleAfter is
// spared, as another replica may be creating it right now. Processes inside adopted
// Pods are left alone: another replica may be serving them.
func (b *Backend) Adopt(ctx context.Context) ([]backends.Session, error) {
	if b.configErr != nil {
		return nil, b.configErr
	}
	pods, err := b.pods().List(ctx, metav1.ListOptions{LabelSelector: b.selector()})
	if err != nil {
		return nil, b.apiError("listing session Pods", err)
	}
	var out []backends.Session
	var problems []string
	suspended, err := b.suspendedClaims(ctx)
	if err != nil {
		return nil, err
	}
	idx, err := b.indexes(ctx)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		live[pod.Name] = true
		if pod.DeletionTimestamp != nil {
			continue
		}
		if podRunning(pod) {
			info, err := b.infoFromPod(pod)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			b.noteLegacy(pod)
			if !b.adoptable(pod, info, idx) {
				// A claim of a pooled Pod not committed, or a Pod that
				// lost the session to a committed one (pool.go).
				if time.Since(info.CreatedAt) > staleAfter {
					b.removeSession(ctx, pod.Name)
				}
				continue
			}
			out = append(out, info)
			continue
		}
		ended := pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodRunning
		if ended || time.Since(pod.CreationTimestamp.Time) > staleAfter {
			if _, ok := suspended[pod.Name]; ok {
				// A resume that never got its Pod running: the session
				// stays suspended, its claim and policy kept.
				b.deletePodOnly(ctx, pod.Name)
				continue
			}
			if err := b.deleteAll(ctx, pod.Name); err != nil {
				problems = append(problems, err.Error())
			}
		}
	}
	out = b.adoptSuspended(out, suspended, live, &problems)
	b.collectOrphans(ctx, live, &problems)
	b.collectIndexes(ctx, idx, live, &problems)
	if len(problems) > 0 {
		return out, boxerr.Failure("kube backend: adopting sessions: %s", strings.Join(problems, "; "))
	}
	return out, nil
}

// collectOrphans deletes stale claims and policies whose Pod is gone.
func (b *Backend) collectOrphans(ctx context.Context, live map[string]bool, problems *[]string) {
	opts := metav1.ListOptions{LabelSelector: b.selector()}
	orphan := func(m metav1.ObjectMeta) bool {
		return !live[m.Labels[LabelPod]] && time.Since(m.CreationTimestamp.Time) > staleAfter && m.DeletionTimestamp == nil
	}
	if nps, err := b.netpols().List(ctx, opts); err != nil {
		*problems = append(*problems, b.apiError("listing NetworkPolicies", err).Error())
	} else {
		for _, np := range nps.Items {
			if orphan(np.ObjectMeta) {
				if err := b.netpols().Delete(ctx, np.Name, metav1.DeleteOptions{}); ignoreNotFound(err) != nil {
					*problems = append(*problems, err.Error())
				}
			}
		}
	}
	if pvcs, err := b.pvcs().List(ctx, opts); err != nil {
		*problems = append(*problems, b.apiError("listing PersistentVolumeClaims", err).Error())
	} else {
		for _, c := range pvcs.Items {
			if orphan(c.ObjectMeta) {
				if err := b.pvcs().Delete(ctx, c.Name, metav1.DeleteOptions{}); ignoreNotFound(err) != nil {
					*problems = append(*problems, err.Error())
				}
			}
		}
	}
}

// touch writes the Pod's last-used annotation, at most every touchEvery,
// so a replica adopting the session later knows how idle it is. Failures
// only cost precision, so they are ignored.
func (b *Backend) touch(ctx context.Context, name string) {
	now := time.Now().UTC()
	if prev, ok := b.touched.Load(name); ok && now.Sub(prev.(time.Time)) < touchEvery {
		return
	}
	b.touched.Store(name, now)
	ctx, cancel := cleanupContext(ctx, 5*time.Second)
	defer cancel()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnLastUsed: now.Format(time.RFC3339Nano)}}})
	_, _ = b.pods().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
}

func (b *Backend) forgetTouch(name string) { b.touched.Delete(name) }

// LastUsed reads the session's last-used annotation: another replica may
// have used the session since this one last did. The runtime's reaper asks
// before reaping, so one replica never reaps a session another serves.
func (b *Backend) LastUsed(ctx context.Context, info backends.Session) (time.Time, error) {
	if b.configErr != nil {
		return time.Time{}, b.configErr
	}
	pod, err := b.pods().Get(ctx, info.BackendSessionID, metav1.GetOptions{})
	if err != nil {
		return time.Time{}, b.apiError("reading Pod "+info.BackendSessionID, err)
	}
	return time.Parse(time.RFC3339Nano, pod.Annotations[AnnLastUsed])
}
